// A code line longer than the text column wraps (site.css); here each line gets its own
// indentation as --indent, so that its continuation rows start four columns right of it and the
// code keeps its shape. The book's 100-column listings fit the column from 1280 px up; the
// prints, and a few lines of code shown as upstream writes them, run longer.
document.querySelectorAll(".md-typeset pre > code > span[id^='__span-']").forEach((line) => {
  const indent = line.textContent.match(/^ */)[0].length;
  if (indent) line.style.setProperty("--indent", indent + "ch");
});

// A figure is drawn wider than the text column, so on the page its smallest labels shrink below
// reading size: a click opens it in a dialog at the size it was drawn (scrolling if the window
// is narrower). A click anywhere in the dialog, or Escape, closes it. A click with a modifier key
// keeps the link's own meaning: the SVG, in a tab of its own.
(function () {
  let dialog = null;

  function enlarge(link) {
    if (!dialog) {
      dialog = document.createElement("dialog");
      dialog.className = "figure-dialog";
      dialog.addEventListener("click", () => dialog.close());
      document.body.appendChild(dialog);
    }
    const image = document.createElement("img");
    image.src = link.href;
    image.alt = link.querySelector("img").alt;
    dialog.replaceChildren(image);
    dialog.showModal();
  }

  document.addEventListener("click", (event) => {
    const link = event.target.closest("a.figure-zoom");
    if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    enlarge(link);
  });
})();
