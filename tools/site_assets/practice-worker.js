// Runs an exercise's tests in Pyodide, off the page's thread: the page can stop an endless
// loop by ending this worker. The same practice/runner.py as `python practice/judge.py`.
// A module worker: Pyodide no longer loads into a classic one.
let python = null; // a promise of [pyodide, the runner module], made on the first run

async function start(base) {
  const { loadPyodide } = await import(base + "pyodide/pyodide.mjs");
  const pyodide = await loadPyodide({ indexURL: base + "pyodide/" });
  const source = await (await fetch(base + "practice/runner.py")).text();
  pyodide.FS.writeFile("/home/pyodide/practice_runner.py", source);
  return [pyodide, pyodide.pyimport("practice_runner")];
}

async function text(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(url + ": " + response.status);
  return response.text();
}

self.onmessage = async (event) => {
  const { id, base, exercise, solution } = event.data;
  try {
    python = python || start(base);
    const [, runner] = await python;
    const tests = await text(base + "practice/" + exercise + "/tests.py");
    self.postMessage({ id, started: true });
    self.postMessage({ id, result: runner.run_json(solution, tests) });
  } catch (error) {
    self.postMessage({ id, error: String(error) });
  }
};
