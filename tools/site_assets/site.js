// A code line longer than the text column wraps (site.css); here each line gets its own
// indentation as --indent, so that its continuation rows start four columns right of it and the
// code keeps its shape. The book's 100-column listings fit the column from 1280 px up; the
// prints, and a few lines of code shown as upstream writes them, run longer.
document.querySelectorAll(".md-typeset pre > code > span[id^='__span-']").forEach((line) => {
  const indent = line.textContent.match(/^ */)[0].length;
  if (indent) line.style.setProperty("--indent", indent + "ch");
});

// A figure is drawn wider than the text column, so on the page its smallest labels shrink below
// reading size: a click opens it in a viewer that fills the window, the figure fitted to the
// window's width but never past the size it was drawn at (readable from 1280 px up). On a phone
// that leaves it small: + and − zoom it (so does a pinch) and the viewer scrolls. The × button,
// Escape or a click beside the figure closes it. A click with a modifier key keeps the link's
// own meaning: the SVG, in a tab of its own.
(function () {
  const STEP = 1.5; // each zoom's factor; the largest zoom is twice the drawn size
  let dialog, view, image;

  function button(label, text, action) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.title = label;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", action);
    return b;
  }

  // Zooms by `factor` about the middle of the view; back at the fitted width, CSS fits it again.
  function zoom(factor) {
    const shown = image.getBoundingClientRect();
    const frame = view.getBoundingClientRect();
    const x = (frame.left + frame.width / 2 - shown.left) / shown.width;
    const y = (frame.top + frame.height / 2 - shown.top) / shown.height;
    const fitted = Math.min(image.naturalWidth, view.clientWidth);
    const width = Math.min(Math.max(shown.width * factor, fitted), 2 * image.naturalWidth);
    image.style.width = width > fitted ? width + "px" : "";
    image.style.maxWidth = width > fitted ? "none" : "";
    view.scrollLeft = x * width - view.clientWidth / 2;
    view.scrollTop = (y * width * shown.height) / shown.width - view.clientHeight / 2;
  }

  function open(link) {
    if (!dialog) {
      dialog = document.createElement("dialog");
      dialog.className = "figure-dialog";
      view = document.createElement("div");
      view.className = "figure-view";
      const tools = document.createElement("div");
      tools.className = "figure-tools";
      tools.append(
        button("Zoom out", "−", () => zoom(1 / STEP)),
        button("Zoom in", "+", () => zoom(STEP)),
        button("Close", "×", () => dialog.close()),
      );
      tools.lastChild.autofocus = true; // the dialog focuses it, not Zoom out
      dialog.append(view, tools);
      dialog.addEventListener("click", (event) => {
        if (event.target === dialog || event.target === view) dialog.close();
      });
      document.body.appendChild(dialog);
    }
    image = document.createElement("img");
    image.src = link.href;
    image.alt = link.querySelector("img").alt;
    view.replaceChildren(image);
    dialog.setAttribute("aria-label", image.alt || "figure");
    dialog.showModal();
  }

  document.addEventListener("click", (event) => {
    const link = event.target.closest("a.figure-zoom");
    if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    open(link);
  });
})();
