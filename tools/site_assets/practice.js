// The exercises at the end of a chapter page: an editor holding the starter, and a Run button
// that sends the code to a worker running the exercise's tests in Pyodide (practice-worker.js).
(function () {
  const base = new URL("..", document.currentScript.src).href; // the site's root
  const LIMIT_MS = 30000; // once Python has loaded: longer than this is an endless loop
  let worker = null;
  let runs = 0;

  function show(block, lines, verdict) {
    const output = block.querySelector(".practice-output");
    output.textContent = "";
    for (const line of lines) {
      const span = document.createElement("span");
      span.className = line.startsWith("PASS") ? "practice-pass"
        : line.startsWith("FAIL") ? "practice-fail" : "";
      span.textContent = line + "\n";
      output.appendChild(span);
    }
    block.dataset.verdict = verdict; // pass | fail | running
  }

  function run(block) {
    const button = block.querySelector(".practice-run");
    const id = ++runs;
    let timer = null;
    button.disabled = true;
    show(block, ["Running the tests (the first run loads Python, a few seconds)..."], "running");
    worker = worker || new Worker(base + "assets/practice-worker.js", { type: "module" });
    const finish = (lines, verdict) => {
      clearTimeout(timer);
      worker.onmessage = null;
      button.disabled = false;
      show(block, lines, verdict);
    };
    worker.onmessage = (event) => {
      const message = event.data;
      if (message.id !== id) return;
      if (message.started) {
        timer = setTimeout(() => {
          worker.terminate();
          worker = null; // the next run starts a fresh one
          finish(["FAIL timeout: the tests took longer than " + LIMIT_MS / 1000 +
                  " s (an endless loop?)", "FAILED: the tests did not finish"], "fail");
        }, LIMIT_MS);
      } else if (message.error) {
        finish(["could not run the tests: " + message.error], "fail");
      } else {
        const result = JSON.parse(message.result);
        const passed = result.outcomes.length > 0 && result.outcomes.every((o) => o.passed);
        finish(result.report, passed ? "pass" : "fail");
      }
    };
    const solution = block.querySelector(".practice-editor").value;
    worker.postMessage({ id, base, exercise: block.dataset.exercise, solution });
  }

  // The learner's code is kept in the browser, one copy per exercise, so that a reload or the
  // next visit finds it; "Back to the starter" drops the copy. Where storage is refused
  // (a private window's quota, a file:// page), the editor still works, only forgets.
  function stored(key) {
    try { return localStorage.getItem(key); } catch (e) { return null; }
  }

  function store(key, code) {
    try {
      if (code === null) localStorage.removeItem(key); else localStorage.setItem(key, code);
    } catch (e) { /* see above */ }
  }

  function setUp(block) {
    const editor = block.querySelector(".practice-editor");
    const starter = JSON.parse(block.dataset.starter);
    const key = "minisgl-practice-" + block.dataset.exercise;
    editor.value = stored(key) ?? starter;
    editor.addEventListener("input", () => store(key, editor.value));
    editor.rows = Math.min(30, starter.split("\n").length + 2);
    editor.addEventListener("keydown", (event) => { // Tab indents instead of leaving
      if (event.key !== "Tab") return;
      event.preventDefault();
      editor.setRangeText("    ", editor.selectionStart, editor.selectionEnd, "end");
      store(key, editor.value); // setRangeText fires no input event
    });
    block.querySelector(".practice-run").addEventListener("click", () => run(block));
    block.querySelector(".practice-reset").addEventListener("click", () => {
      editor.value = starter;
      store(key, null);
      show(block, [], "");
    });
  }

  document.querySelectorAll(".practice").forEach(setUp);
})();
