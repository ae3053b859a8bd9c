// Runs inside JupyterLab's page, sent by scripts/browser_check.py through Selenium.
// window.jupyterapp is the JupyterLab application (exposed by --LabApp.expose_app_in_browser).
// Every function finds the notebook's tab by its path relative to the server root.
window.__browserCheck = (() => {
  const WIDGET = 'application/vnd.jupyter.widget-view+json';
  const BAD_WIDGET_TEXT = /Loading widget|Error displaying widget|Failed to load model class|model not found/i;
  const ERROR_VIEW = '.jupyter-widgets-error-widget';  // ipywidgets' red "Click to show javascript error." box

  const sleep = (ms) => new Promise(resolve => setTimeout(resolve, ms));
  const text = (el) => (el ? el.textContent || '' : '').replace(/\s+/g, ' ').trim().slice(0, 300);
  // What a cell printed (its stdout streams, in order), from the model rather than the page.
  const stdout = (outputs) => outputs.filter(o => o.output_type === 'stream' && o.name === 'stdout')
    .map(o => Array.isArray(o.text) ? o.text.join('') : o.text).join('');
  const findPanel = (path) => {
    const app = window.jupyterapp;
    return app ? Array.from(app.shell.widgets('main')).find(w => w.context && w.context.path === path) : undefined;
  };

  // The watchdog's clock: when the page last received a message from the notebook's kernel.
  const listen = (kernel) => {
    window.__browserCheckHeard = Date.now();
    if (window.__browserCheckListening === kernel) return;
    window.__browserCheckListening = kernel;
    const heard = (_, args) => { if (!args || args.direction !== 'send') window.__browserCheckHeard = Date.now(); };
    (kernel.anyMessage || kernel.iopubMessage).connect(heard);
  };

  // Wait for the app, the tab and an idle kernel; clear the saved outputs; start "Run All Cells".
  // Resolves once the run has started; window.__browserCheckRun.done turns true when it ends.
  // The kernel gets silenceMs (not the whole timeoutMs) to start and go idle.
  async function openAndRun(path, timeoutMs, silenceMs) {
    const t0 = Date.now();
    const wait = async (what, test, limitMs) => {
      const t1 = Date.now();
      while (!test()) {
        if (Date.now() - t0 > timeoutMs || (limitMs && Date.now() - t1 > limitMs)) {
          throw new Error('timed out waiting for ' + what);
        }
        await sleep(100);
      }
    };
    await wait('window.jupyterapp', () => window.jupyterapp);
    const app = window.jupyterapp;
    await app.started;
    await app.restored;
    await wait('the notebook tab', () => findPanel(path));
    const panel = findPanel(path);
    await panel.context.ready;
    await panel.sessionContext.ready;
    await wait('a kernel', () => panel.sessionContext.session && panel.sessionContext.session.kernel, silenceMs);
    const kernel = panel.sessionContext.session.kernel;
    listen(kernel);
    await wait('the kernel to be idle', () => kernel.status === 'idle', silenceMs);
    app.shell.collapseLeft();  // the notebook gets the whole width (and the screenshot)
    app.shell.activateById(panel.id);
    await app.commands.execute('notebook:clear-all-cell-outputs');
    window.__browserCheckRun = {done: false};
    app.commands.execute('notebook:run-all-cells').then(
      (ok) => { window.__browserCheckRun = {done: true, ok: ok}; },
      (err) => { window.__browserCheckRun = {done: true, ok: false, error: String(err)}; });
    return {ok: true, kernel: kernel.name};
  }

  // Is the run over? (run promise settled, kernel idle, no cell queued or running)
  function state(path) {
    const panel = findPanel(path);
    if (!panel) return {error: 'the notebook tab is gone'};
    const session = panel.sessionContext.session;
    const cells = panel.content.widgets.filter(c => c.model.type === 'code');
    const running = cells.filter(c => c.model.executionState === 'running' ||
      /\[\*\]/.test(text(c.node.querySelector('.jp-InputPrompt'))));
    const pending = running.length;
    return {run: window.__browserCheckRun || {done: false},
            heardMsAgo: window.__browserCheckHeard ? Date.now() - window.__browserCheckHeard : null,
            runningCell: running.length ? panel.content.widgets.indexOf(running[0]) : null,
            status: session && session.kernel ? session.kernel.status : 'none', pending: pending,
            executed: cells.filter(c => c.model.executionCount !== null).length, code: cells.length};
  }

  // Per code cell: what the model holds (errors, widget views) next to what the page shows.
  function inspect(path) {
    const panel = findPanel(path);
    const report = {cells: [], images: 0};
    panel.content.widgets.forEach((cell, index) => {
      if (cell.model.type !== 'code') return;
      const source = cell.model.sharedModel.getSource();
      const outputs = cell.model.outputs.toJSON();
      // cell.outputArea.widgets holds one child per model output, in order: pair them up
      const shown = cell.outputArea.widgets.map(w => w.node.querySelector('.jp-OutputArea-output') || w.node);
      const all = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output'));  // nested ones too
      const widgets = [];
      outputs.forEach((o, i) => {
        if (!(o.data && o.data[WIDGET])) return;
        const el = shown[i];
        widgets.push({live: !!(el && el.querySelector('.jupyter-widgets') && !el.querySelector(ERROR_VIEW)) &&
                            !BAD_WIDGET_TEXT.test(text(el)),
                      text: el ? text(el) : '(no output element)'});
      });
      const images = all.flatMap(o => Array.from(o.querySelectorAll('img')))
        .filter(img => img.complete && img.naturalWidth > 0).length;
      report.images += images;
      report.cells.push({
        index: index, executed: cell.model.executionCount !== null, empty: !source.trim(),
        head: source.trim().split('\n')[0].slice(0, 80), source: source, stdout: stdout(outputs),
        errors: outputs.filter(o => o.output_type === 'error').map(o =>
          ({ename: o.ename, evalue: o.evalue, traceback: (o.traceback || []).join('\n')})),
        domErrors: shown.filter(o => o.matches('[data-mime-type="application/vnd.jupyter.error"]') ||
          o.querySelector('[data-mime-type="application/vnd.jupyter.error"]')).map(text),
        // JupyterLab renders tracebacks with the stderr mime type too: keep the stream outputs only
        stderr: shown.filter((o, i) => outputs[i] && outputs[i].output_type === 'stream' &&
          outputs[i].name === 'stderr').map(text),
        widgets: widgets,
        badWidgetText: all.filter(o => o.querySelector(ERROR_VIEW) || BAD_WIDGET_TEXT.test(text(o))).map(text),
        figureText: all.map(text).filter(t => /^<Figure size [^>]*>$/.test(t)),
        images: images});
    });
    return report;
  }

  // A fingerprint of everything the kernel can change in the outputs: text (slider read-outs excluded,
  // the browser changes those by itself), Textarea values and images (hashed).
  function signature(path) {
    const panel = findPanel(path);
    const hash = (s) => {
      let h = 5381;
      for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
      return h;
    };
    let sig = '';
    panel.content.node.querySelectorAll('.jp-Cell-outputArea').forEach(area => {
      const walk = document.createTreeWalker(area, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
      for (let n = walk.nextNode(); n; n = walk.nextNode()) {
        if (n.nodeType === Node.ELEMENT_NODE) {
          if (n.tagName === 'IMG') sig += '[img ' + hash(n.src) + ']';
          if (n.tagName === 'TEXTAREA') sig += '[textarea ' + n.value + ']';
        } else if (!n.parentElement.closest('.widget-readout')) {
          sig += n.nodeValue;
        }
      }
    });
    return {sig: sig, status: panel.sessionContext.session.kernel.status};
  }

  // Window height that shows the whole notebook (it scrolls inside .jp-WindowedPanel-outer); scrolls to top.
  function fullHeight(path) {
    const panel = findPanel(path);
    const outer = panel.content.node.querySelector('.jp-WindowedPanel-outer') || panel.content.node;
    outer.scrollTop = 0;
    const cells = panel.content.widgets;
    if (!cells.length) return window.innerHeight;
    // the last cell's bottom, not scrollHeight: "scroll past end" pads the notebook by a viewport's height
    const bottom = cells[cells.length - 1].node.getBoundingClientRect().bottom - outer.getBoundingClientRect().top;
    return window.innerHeight - outer.clientHeight + bottom + 150;
  }

  // Mark every document clean, so that leaving the page never asks "discard changes?".
  function markClean() {
    if (!window.jupyterapp) return;
    Array.from(window.jupyterapp.shell.widgets('main')).forEach(w => {
      if (w.context && w.context.model) w.context.model.dirty = false;
    });
  }

  // The learner's round trip. Show the file browser in `folder` (the test then double-clicks a file in it).
  async function browseTo(folder) {
    const app = window.jupyterapp;
    const browser = Array.from(app.shell.widgets('left')).find(w => w.id === 'filebrowser');
    app.shell.expandLeft();
    app.shell.activateById('filebrowser');
    await browser.model.cd('/' + folder);
    return {ok: true, items: Array.from(browser.model.items()).map(i => i.name)};
  }

  // Is `path` open in a tab (an editor opened from the file browser)?
  function isOpen(path) { return !!findPanel(path); }

  // Replace the open file's text, as an editor would hold it after typing, and save it (Ctrl-S's command).
  async function typeAndSave(path, text) {
    const panel = findPanel(path);
    window.jupyterapp.shell.activateById(panel.id);
    panel.context.model.sharedModel.setSource(text);
    await panel.context.save();  // what Ctrl-S does for this document
    return {ok: !panel.context.model.dirty, saved: panel.context.contentsModel.last_modified};
  }

  // Run one cell of the notebook at `path` (as Shift-Enter would) and resolve with what it printed.
  async function runCell(path, index, timeoutMs) {
    const app = window.jupyterapp;
    const panel = findPanel(path);
    app.shell.activateById(panel.id);
    panel.content.activeCellIndex = index;
    const cell = panel.content.widgets[index];
    const before = cell.model.executionCount;
    await app.commands.execute('notebook:run-cell');
    const t0 = Date.now();
    while (cell.model.executionCount === before || cell.model.executionCount === null ||
           panel.sessionContext.session.kernel.status !== 'idle') {
      if (Date.now() - t0 > timeoutMs) return {ok: false, error: 'the cell did not finish in time'};
      await sleep(200);
    }
    return {ok: true, stdout: stdout(cell.model.outputs.toJSON())};
  }

  return {openAndRun, state, inspect, signature, fullHeight, markClean, browseTo, isOpen, typeAndSave,
          runCell};
})();
