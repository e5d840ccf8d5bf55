// The GAE dashboard: a plain ES module (no build step) that TensorBoard imports into the "GAE"
// tab's iframe and calls render() on. It reads the plugin's JSON routes, which resolve against
// the iframe's <base href="plugin/gae/">, and draws first the summary (the methods ranked on each
// faithfulness metric with their standard errors, how that ranking moved over training, each metric's
// chart over training with one colour per method, the curves, the declared regions' shares with their alerts),
// then the tracked samples x methods at the chosen step (every token set of a model with several),
// with hover read-out of every patch, pixel, token or feature.
//
// Colours: a method whose relevance is signed (the /run answer's `signed`, from the method's registered fact) is
// drawn on a diverging colormap with white at 0 and symmetric limits, a non-negative one on a sequential colormap,
// in every sample and step, as in the Images tab's pictures; by default each map spans its own largest magnitude
// (the Images tab's "per_map"). The run shown is the URL's (`#gae&run=NAME`), else the last one.

const POLL_MS = 15000; // how often the tab asks again for the runs and the run shown (a run may still be written)

const PANEL_PX = 224;
const SVG = "http://www.w3.org/2000/svg";

// A baseline method (the registry's floors, such as the random relevance every method must beat): drawn grey and
// dashed, ranked last.
const isFloor = (method) => Boolean(state.info && state.info.floors.includes(method));

const state = {
  runs: [],
  run: null,
  info: null, // the /run answer: steps, methods, floors, metrics, samples, ranges
  stepIndex: 0,
  colormap: "auto",
  opacity: 1, // 1: every pixel's colour is the colour bar's; lower lets the greyscale input show through
  scale: "map", // each map its own largest magnitude, as in the Images tab ("shared": one scale per sample)
  colormaps: null,
  steps: new Map(), // "run\u0000step" -> the /step answer
  ui: {},
};

async function getJSON(path) {
  const response = await fetch(path, {headers: {Accept: "application/json"}});
  if (!response.ok) {
    throw new Error(`${path}: HTTP ${response.status} ${(await response.text()).slice(0, 200)}`);
  }
  return response.json();
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  return node;
}

function format(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  if (magnitude < 0.001 || magnitude >= 10000) return value.toExponential(2);
  const text = value.toPrecision(3);
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text; // "0.330" -> "0.33", but "100" stays
}

const STYLE = `
  body { margin: 0; font-family: Roboto, "Helvetica Neue", Arial, sans-serif; font-size: 13px; color: #212121; background: #fff; }
  #gae-dashboard { padding: 12px 16px 32px; }
  #gae-dashboard [hidden] { display: none; }
  .gae-controls { display: flex; flex-wrap: wrap; gap: 18px; align-items: center; padding: 8px 0 12px; border-bottom: 1px solid #e0e0e0;
                  position: sticky; top: 0; background: #fff; z-index: 2; }
  .gae-controls label { display: flex; gap: 6px; align-items: center; }
  .gae-controls input[type=range] { vertical-align: middle; }
  #gae-step { width: 260px; }
  .gae-status { color: #b71c1c; padding: 8px 0; min-height: 1em; }
  .gae-hint { color: #616161; padding: 6px 0; }
  #gae-updated:empty { display: none; }
  .gae-section { font-size: 15px; font-weight: 500; margin: 18px 0 6px; }
  .gae-sample { border-bottom: 1px solid #eeeeee; padding: 10px 0; }
  .gae-sample-title { font-weight: 500; margin-bottom: 6px; }
  .gae-panels { display: flex; flex-wrap: wrap; gap: 10px; }
  .gae-panel { display: flex; flex-direction: column; align-items: center; gap: 3px; }
  .gae-panel canvas { image-rendering: pixelated; cursor: crosshair; }
  .gae-panel-title { font-size: 12px; color: #424242; }
  .gae-bar { display: flex; justify-content: space-between; width: 100%; font-size: 11px; color: #616161; }
  .gae-text-row { display: flex; gap: 10px; align-items: baseline; margin: 4px 0; }
  .gae-text-method { width: 150px; flex: none; color: #424242; text-align: right; font-size: 12px; }
  .gae-tokens { display: flex; flex-wrap: wrap; gap: 2px; }
  .gae-token { padding: 1px 4px; border-radius: 2px; font-family: "Roboto Mono", Menlo, monospace; font-size: 13px; cursor: default; }
  .gae-token.muted { background: #e0e0e0; color: #757575; }
  table.gae-features { border-collapse: collapse; }
  table.gae-features td, table.gae-features th { padding: 3px 10px; text-align: right; font-weight: normal; }
  table.gae-features th { color: #424242; font-size: 12px; }
  table.gae-features td:first-child { text-align: left; }
  .gae-summary { display: flex; flex-wrap: wrap; gap: 14px 28px; align-items: flex-start; }
  table.gae-ranking { border-collapse: collapse; }
  table.gae-ranking caption { text-align: left; font-weight: 500; padding-bottom: 4px; }
  table.gae-ranking caption .gae-direction { font-weight: normal; color: #616161; }
  table.gae-ranking td, table.gae-ranking th { padding: 2px 8px; border-bottom: 1px solid #eeeeee; text-align: right;
                                              font-variant-numeric: tabular-nums; white-space: nowrap; }
  table.gae-ranking th { font-weight: normal; color: #616161; font-size: 12px; }
  table.gae-ranking td.gae-method, table.gae-ranking th.gae-method { text-align: left; }
  table.gae-ranking tr.gae-random td { color: #757575; font-style: italic; }
  table.gae-ranking td.gae-rank-moved { color: #1565c0; }
  .gae-section.gae-flagged { color: #b71c1c; }
  ul.gae-flags { color: #b71c1c; margin: 4px 0 8px; padding-left: 20px; }
  ul.gae-flags ul { color: #424242; }
  .gae-empty { display: flex; align-items: center; justify-content: center; text-align: center; background: #f5f5f5;
               color: #616161; border: 1px dashed #bdbdbd; font-size: 12px; padding: 8px; box-sizing: border-box; }
  .gae-empty-text { color: #616161; font-style: italic; font-size: 12px; }
  .gae-set { margin: 8px 0 4px; }
  .gae-set-title { font-size: 12px; font-weight: 500; color: #424242; margin-bottom: 4px; }
  .gae-set-tokens { font-family: "Roboto Mono", Menlo, monospace; font-size: 12px; color: #424242; }
  .gae-matrix-methods { display: flex; flex-wrap: wrap; gap: 14px 40px; align-items: flex-start; }
  .gae-matrices { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
  table.gae-matrix { border-collapse: collapse; }
  table.gae-matrix td.gae-cell { width: 16px; height: 16px; padding: 0; border: 1px solid #fff; cursor: crosshair; }
  table.gae-matrix th { font-weight: normal; font-family: "Roboto Mono", Menlo, monospace; font-size: 11px; color: #424242; }
  table.gae-matrix th.gae-col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; padding: 2px 0; }
  table.gae-matrix th.gae-row { text-align: right; padding-right: 4px; white-space: nowrap; }
  table.gae-matrix th.gae-zero-row { color: #b71c1c; cursor: help; }
  table.gae-matrix caption { font-size: 12px; color: #424242; text-align: left; padding-bottom: 3px; }
  .gae-curves, .gae-histories { display: flex; flex-wrap: wrap; gap: 24px; }
  .gae-curve text, .gae-history text { font-size: 11px; fill: #424242; }
  #gae-tooltip { position: fixed; pointer-events: none; background: rgba(33, 33, 33, 0.92); color: #fff; padding: 4px 7px;
                 border-radius: 3px; font-size: 12px; display: none; z-index: 10; white-space: nowrap; }
`;

// --- colours ------------------------------------------------------------------------------------

function colormapTable(name, signed) {
  const maps = state.colormaps;
  if (name === "auto") return signed ? maps.diverging.RdBu_r : maps.sequential.inferno;
  return maps.sequential[name] || maps.diverging[name];
}

// Whether a method is drawn signed: its registered fact (the /run answer), the same in every sample and step.
function isSigned(method) {
  const signed = (state.info && state.info.signed) || {};
  return Boolean(signed[method.split("/")[0]]);
}

// The colormap's name on a heatmap, so that a reader (and a test) can tell which convention drew it.
function colormapName(signed) {
  return state.colormap === "auto" ? (signed ? "RdBu_r" : "inferno") : state.colormap;
}

// The colour range of some values: [0, max] for a non-negative method, [-m, m] around 0 for a signed one;
// "run" takes the method's largest magnitude over every step instead of these values' own.
function rangeOf(values, method) {
  let top = 0;
  const signed = isSigned(method);
  for (const v of values) {
    if (v === null || !Number.isFinite(v)) continue;
    const magnitude = signed ? Math.abs(v) : v;
    if (magnitude > top) top = magnitude;
  }
  if (state.scale === "run") top = state.info.ranges[method] || 0;
  if (!(top > 0)) top = 1;
  return {vmin: signed ? -top : 0, vmax: top, signed};
}

// The colour range of each method's map of one sample. "shared" (the default): one range over every
// method's map in the same units (a group: one token set, token relevance or an input-space map), so
// the same colour is the same relevance in every map of the sample (signed and non-negative methods apart);
// "map": each map its own maximum; "run": each method its largest magnitude over all steps. All-zero maps do
// not set a shared range.
function rangesOf(entries) {
  const out = {};
  const pooled = {};
  const group = (e) => `${e.group}/${isSigned(e.method)}`;
  if (state.scale === "shared") {
    for (const e of entries) {
      if (e.allZero) continue;
      (pooled[group(e)] = pooled[group(e)] || []).push(e.values);
    }
  }
  for (const e of entries) {
    const values = pooled[group(e)] ? pooled[group(e)].flat() : e.values;
    out[e.method] = rangeOf(values, e.method);
  }
  return out;
}

function scaleNote() {
  return {shared: "one colour scale per sample, shared by every method (signed and non-negative methods apart)", map: "each map scaled to its own maximum",
          run: "each method scaled to its maximum over all steps"}[state.scale];
}

function colourOf(value, range, table) {
  if (value === null) return [128, 128, 128];
  const t = (value - range.vmin) / (range.vmax - range.vmin);
  return table[Math.max(0, Math.min(255, Math.round(t * 255)))];
}

function css(rgb) {
  return `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})`;
}

function inkFor(rgb) {
  return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] >= 128 ? "#000" : "#fff";
}

function colourBar(range, table, width) {
  const canvas = el("canvas", {width: String(width), height: "8"});
  const ctx = canvas.getContext("2d");
  for (let x = 0; x < width; x++) {
    ctx.fillStyle = css(table[Math.round((x / (width - 1)) * 255)]);
    ctx.fillRect(x, 0, 1, 8);
  }
  const labels = el("div", {class: "gae-bar"}, el("span", {text: format(range.vmin)}));
  if (range.signed) labels.append(el("span", {text: "0"}));
  labels.append(el("span", {text: format(range.vmax)}));
  return el("div", {style: `width:${width}px`}, canvas, labels);
}

// --- tooltip ------------------------------------------------------------------------------------

function showTip(event, text) {
  const tip = state.ui.tooltip;
  tip.textContent = text;
  tip.style.display = "block";
  tip.style.left = `${event.clientX + 14}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

function hideTip() {
  state.ui.tooltip.style.display = "none";
}

// --- one sample per modality --------------------------------------------------------------------

function inputCanvas(sample) {
  if (!sample._pixels) {
    const {height, width, rgb} = sample.input;
    const bytes = Uint8Array.from(atob(rgb), (c) => c.charCodeAt(0));
    const colour = new ImageData(width, height);
    const grey = new ImageData(width, height);
    for (let i = 0; i < width * height; i++) {
      const [r, g, b] = [bytes[3 * i], bytes[3 * i + 1], bytes[3 * i + 2]];
      const y = Math.round(0.299 * r + 0.587 * g + 0.114 * b);
      colour.data.set([r, g, b, 255], 4 * i);
      grey.data.set([y, y, y, 255], 4 * i);
    }
    const toCanvas = (data) => {
      const c = el("canvas", {width: String(width), height: String(height)});
      c.getContext("2d").putImageData(data, 0, 0);
      return c;
    };
    sample._pixels = {colour: toCanvas(colour), grey: toCanvas(grey), height, width};
  }
  return sample._pixels;
}

function panelSize(pixels) {
  const scale = PANEL_PX / Math.max(pixels.height, pixels.width);
  return [Math.round(pixels.width * scale), Math.round(pixels.height * scale)];
}

// The values of a map on a grid [rows, cols]: the patch grid for token relevance, pixels for a Captum map.
function imageGrid(sample, relevance) {
  if (relevance.space === "tokens") {
    const [rows, cols] = sample.grid;
    return {rows, cols, values: relevance.values.slice(sample.prefix_tokens, sample.prefix_tokens + rows * cols), unit: "patch"};
  }
  const [rows, cols] = relevance.shape;
  return {rows, cols, values: relevance.values, unit: "pixel"};
}

// Why a map is not drawn: it is zero everywhere (the method's reason), or its entry could not be read.
function notDrawn(relevance) {
  if (relevance.error) return `not drawn: this entry could not be read (${relevance.error})`;
  return relevance.all_zero || null;
}

function emptyPanel(reason, width, height, method) {
  return el("div", {class: "gae-empty", style: `width:${width}px;height:${height}px`, "data-method": method,
                    title: reason, text: reason});
}

// `by` is method -> relevance (the /step answer's relevance of one sample, or of one of its token sets);
// `set` names the token set, so that its maps share a range with each other and no other set's.
function imageSample(sample, by, set = "") {
  const pixels = inputCanvas(sample);
  const [w, h] = panelSize(pixels);
  const panels = el("div", {class: "gae-panels"});
  const input = el("canvas", {width: String(w), height: String(h), class: "gae-input"});
  const ictx = input.getContext("2d");
  ictx.imageSmoothingEnabled = false;
  ictx.drawImage(pixels.colour, 0, 0, w, h);
  panels.append(el("div", {class: "gae-panel"}, el("div", {class: "gae-panel-title", text: set ? `input · ${set}` : "input"}), input));
  const methods = state.info.methods.filter((m) => by[m]);
  const drawn = methods.filter((m) => !by[m].error);
  const grids = Object.fromEntries(drawn.map((m) => [m, imageGrid(sample, by[m])]));
  const ranges = rangesOf(drawn.map((m) => ({method: m, values: grids[m].values, allZero: Boolean(by[m].all_zero),
                                             group: `${set}/${by[m].space}`})));
  for (const method of methods) {
    const relevance = by[method];
    const title = el("div", {class: "gae-panel-title", text: set ? `${method} · ${set}` : method});
    if (notDrawn(relevance)) {
      panels.append(el("div", {class: "gae-panel"}, title, emptyPanel(notDrawn(relevance), w, h + 22, method)));
      continue;
    }
    const grid = grids[method];
    const range = ranges[method];
    const table = colormapTable(state.colormap, range.signed);
    const heat = new ImageData(grid.cols, grid.rows);
    grid.values.forEach((v, i) => heat.data.set([...colourOf(v, range, table), 255], 4 * i));
    const cells = el("canvas", {width: String(grid.cols), height: String(grid.rows)});
    cells.getContext("2d").putImageData(heat, 0, 0);
    const canvas = el("canvas", {width: String(w), height: String(h), class: "gae-heatmap", "data-method": method,
                                 "data-sample": String(sample.sample), "data-set": set,
                                 "data-colormap": colormapName(range.signed)});
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    // The heatmap in the colour bar's colours; below full opacity the greyscale input shows through.
    ctx.drawImage(pixels.grey, 0, 0, w, h);
    ctx.globalAlpha = state.opacity;
    ctx.drawImage(cells, 0, 0, w, h);
    canvas.addEventListener("mousemove", (event) => {
      const col = Math.min(grid.cols - 1, Math.floor((event.offsetX / canvas.clientWidth) * grid.cols));
      const row = Math.min(grid.rows - 1, Math.floor((event.offsetY / canvas.clientHeight) * grid.rows));
      showTip(event, `${method} · ${grid.unit} (${row}, ${col}): ${format(grid.values[row * grid.cols + col])}`);
    });
    canvas.addEventListener("mouseleave", hideTip);
    panels.append(el("div", {class: "gae-panel"}, title, canvas, colourBar(range, table, w)));
  }
  return panels;
}

function textSample(sample, by, set = "") {
  const block = el("div");
  const tokens = sample.input.tokens;
  const methods = state.info.methods.filter((m) => by[m]);
  const scored = (m) => by[m].values.filter((_, i) => sample.valid[i] && !sample.muted[i]);
  const ranges = rangesOf(methods.filter((m) => !by[m].error).map((m) => (
    {method: m, values: scored(m), allZero: Boolean(by[m].all_zero), group: set})));
  for (const method of methods) {
    const relevance = by[method];
    const name = el("div", {class: "gae-text-method"}, el("div", {text: method}));
    if (notDrawn(relevance)) {
      block.append(el("div", {class: "gae-text-row", "data-method": method}, name,
                      el("div", {class: "gae-empty-text", text: notDrawn(relevance)})));
      continue;
    }
    const range = ranges[method];
    const table = colormapTable(state.colormap, range.signed);
    name.append(colourBar(range, table, 140));
    const row = el("div", {class: "gae-tokens", "data-method": method, "data-set": set,
                           "data-colormap": colormapName(range.signed)});
    tokens.forEach((token, i) => {
      if (!sample.valid[i]) return;
      const value = relevance.values[i];
      const span = el("span", {class: "gae-token", text: token});
      if (sample.muted[i]) span.classList.add("muted");
      else {
        const rgb = colourOf(value, range, table);
        span.style.background = css(rgb);
        span.style.color = inkFor(rgb);
      }
      span.addEventListener("mousemove", (event) => showTip(event, `${method} · ${token}: ${format(value)}`));
      span.addEventListener("mouseleave", hideTip);
      row.append(span);
    });
    block.append(el("div", {class: "gae-text-row"}, name, row));
  }
  return block;
}

function tabularSample(sample, by, set = "") {
  const methods = state.info.methods.filter((m) => by[m]);
  const count = sample.feature_names.length;
  const valuesOf = (relevance) => (relevance.space === "tokens"
    ? relevance.values.slice(sample.prefix_tokens, sample.prefix_tokens + count) : relevance.values);
  const ranges = rangesOf(methods.filter((m) => !by[m].error).map((m) => (
    {method: m, values: valuesOf(by[m]), allZero: Boolean(by[m].all_zero), group: `${set}/${by[m].space}`})));
  const header = el("tr", {}, el("th", {text: "feature"}), ...methods.map((m) => el("th", {text: m})));
  const columns = methods.map((method) => {
    const range = ranges[method] || rangeOf([], method);
    const empty = notDrawn(by[method]);
    return {method, values: empty ? [] : valuesOf(by[method]), range, table: colormapTable(state.colormap, range.signed),
            empty};
  });
  const rows = sample.feature_names.map((name, f) => {
    const label = `${name} = ${format(sample.input.values[f])}`;
    const tr = el("tr", {}, el("td", {text: label}));
    for (const column of columns) {
      const td = el("td", {text: format(column.values[f])});
      if (!column.empty) {
        const rgb = colourOf(column.values[f], column.range, column.table);
        td.style.background = css(rgb);
        td.style.color = inkFor(rgb);
      }
      td.addEventListener("mousemove", (event) => showTip(event, `${column.method} · ${name}: ${format(column.values[f])}`));
      td.addEventListener("mouseleave", hideTip);
      tr.append(td);
    }
    return tr;
  });
  const bars = el("tr", {}, el("td"), ...columns.map((c) => el("td", {}, c.empty
    ? el("div", {class: "gae-empty-text", style: "width:110px;white-space:normal", text: c.empty})
    : colourBar(c.range, c.table, 110))));
  return el("table", {class: "gae-features"}, header, ...rows, bars);
}

function modalitySample(sample, by, set = "") {
  return sample.modality === "image" ? imageSample(sample, by, set)
    : sample.modality === "text" ? textSample(sample, by, set) : tabularSample(sample, by, set);
}

// --- models with several token sets -------------------------------------------------------------

function setTokens(tokenSet) {
  if (tokenSet.modality !== "text") return null;
  return tokenSet.input.tokens.filter((_, i) => tokenSet.valid[i]);
}

// A decoder's rows: per method, one target x set matrix per token set (row t: the relevance of the
// explanation of the token predicted at target position t, over the set's tokens).
function rowMatrices(sample, at) {
  const query = sample.sets.find((x) => x.query) || sample.sets[sample.sets.length - 1];
  const positions = query.input.tokens.map((_, t) => t).filter((t) => query.modality !== "text" || query.valid[t]);
  const labels = at.row_labels || query.input.tokens;
  const block = el("div", {class: "gae-matrix-methods"});
  const byMethod = state.info.methods.map((method) => [method, sample.sets.filter((x) => at.rows[x.set] && at.rows[x.set][method])
    .map((tokenSet) => {
      const relevance = at.rows[tokenSet.set][method];
      const [, n] = relevance.shape || [0, 0];
      const columns = [...Array(n).keys()].filter((c) => tokenSet.modality !== "text" || tokenSet.valid[c]);
      const names = tokenSet.modality === "text" ? tokenSet.input.tokens : columns.map(String);
      const values = positions.flatMap((t) => columns.map((c) => relevance.values[t * n + c]));
      return {key: `${method}/${tokenSet.set}`, tokenSet, relevance, n, columns, names, values};
    })]);
  // Shared: one range per token set over every method's matrix.
  const ranges = rangesOf(byMethod.flatMap(([, matrices]) => matrices.map((m) => (
    {method: m.key, values: m.values, allZero: Boolean(notDrawn(m.relevance)), group: m.tokenSet.set}))));
  for (const [method, matrices] of byMethod) {
    const line = el("div", {class: "gae-matrices"});
    for (const m of matrices) {
      const caption = el("caption", {text: `${method} · ${m.tokenSet.set} (rows: target positions)`});
      if (notDrawn(m.relevance)) {
        line.append(el("div", {}, el("div", {class: "gae-panel-title", text: caption.textContent}),
                       emptyPanel(notDrawn(m.relevance), 220, 120, method)));
        continue;
      }
      const range = state.scale === "run" ? rangeOf(m.values, method) : ranges[m.key];
      const table = colormapTable(state.colormap, range.signed);
      const head = el("tr", {}, el("th"), ...m.columns.map((c) => el("th", {class: "gae-col", text: m.names[c]})));
      const body = positions.map((t) => {
        const zero = (m.relevance.zero_rows || []).includes(t);
        const label = el("th", {class: zero ? "gae-row gae-zero-row" : "gae-row", text: `${t}: ${labels[t]}${zero ? " ∅" : ""}`});
        if (zero) {
          label.addEventListener("mousemove", (event) => showTip(event, `${method} · row ${t}: ${m.relevance.zero_reason}`));
          label.addEventListener("mouseleave", hideTip);
        }
        const tr = el("tr", {}, label);
        for (const c of m.columns) {
          const value = m.relevance.values[t * m.n + c];
          const td = el("td", {class: "gae-cell"});
          td.style.background = css(colourOf(value, range, table));
          td.addEventListener("mousemove", (event) => showTip(event,
            `${method} · row ${t} (predicts ${labels[t]}) · ${m.tokenSet.set} ${m.names[c]}: ${format(value)}`));
          td.addEventListener("mouseleave", hideTip);
          tr.append(td);
        }
        return tr;
      });
      line.append(el("div", {}, el("table", {class: "gae-matrix", "data-method": method, "data-set": m.tokenSet.set},
                                    caption, head, ...body), colourBar(range, table, 160)));
    }
    block.append(line);
  }
  if (byMethod.some(([, matrices]) => matrices.some((m) => (m.relevance.zero_rows || []).length))) {
    return el("div", {}, block, el("div", {class: "gae-hint", text: "∅: the row is zero everywhere (hover its label for why)"}));
  }
  return block;
}

// Every token set of the sample: its tokens (or picture) and each method's relevance over it.
function setsSample(sample, at) {
  const block = el("div");
  const inputs = el("div", {class: "gae-set"});
  for (const tokenSet of sample.sets) {
    const tokens = setTokens(tokenSet);
    if (tokens) {
      inputs.append(el("div", {class: "gae-set-tokens", "data-set": tokenSet.set},
                       el("b", {text: `${tokenSet.set}${tokenSet.query ? " (query)" : ""}: `}), tokens.join(" ")));
    }
  }
  block.append(inputs);
  if (at.rows && Object.keys(at.rows).length) {
    block.append(rowMatrices(sample, at));
    return block;
  }
  for (const tokenSet of sample.sets) {
    const by = (at.sets || {})[tokenSet.set];
    if (!by) continue;
    block.append(el("div", {class: "gae-set", "data-set": tokenSet.set},
                    el("div", {class: "gae-set-title", text: `token set "${tokenSet.set}"${tokenSet.query ? " (query)" : ""}`}),
                    modalitySample(tokenSet, by, tokenSet.set)));
  }
  return block;
}

function className(sample, value) {
  if (value === null || value === undefined) return "?";
  if (Array.isArray(value)) return value.length ? value.map((v) => className(sample, v)).join(", ") : "none";
  const names = sample.class_names;
  const name = names && names[value] !== undefined && names[value] !== String(value) ? ` (${names[value]})` : "";
  return `${value}${name}`;
}

function sampleTitle(sample, at) {
  const prediction = at.prediction;
  if (at.rows && Object.keys(at.rows).length) return `val #${sample.sample} · row t explains the token predicted at target position t`;
  const parts = [`val #${sample.sample}`];
  if (sample.label !== null && sample.label !== undefined) parts.push(`label ${className(sample, sample.label)}`);
  if (prediction) {
    const p = prediction.probability === null ? "" : `, p=${prediction.probability.toFixed(2)}`;
    if (prediction.pred !== null) parts.push(`pred ${className(sample, prediction.pred)}${prediction.pred === prediction.target ? p : ""}`);
    if (prediction.target !== null && prediction.target !== prediction.pred) parts.push(`explains ${className(sample, prediction.target)}${p}`);
  }
  return parts.join(" · ");
}

// --- the summary: methods ranked per metric, and how the ranking moved --------------------------

function plusMinus(value, error) {
  if (value === null || value === undefined) return "–";
  return error === null || error === undefined ? format(value) : `${format(value)} ± ${format(error)}`;
}

// One table per metric: the methods best first at the last step it was scored, value ± standard error,
// then the method's rank at every step where the metric was scored (a rank that changed is blue). Methods
// the standard errors do not tell apart share a rank, marked "=" (e.g. "1=" twice).
function rankingTable(entry) {
  const last = entry.steps.length - 1;
  const arrow = entry.higher_is_better ? "↑ higher is better" : "↓ lower is better";
  const caption = el("caption", {}, entry.metric, el("span", {class: "gae-direction", text: ` (${arrow})`}));
  const history = entry.steps.length > 1;
  const head = el("tr", {}, el("th", {text: "rank"}), el("th", {class: "gae-method", text: "method"}),
                  el("th", {text: `at step ${entry.steps[last]} (± s.e.)`}),
                  ...(history ? entry.steps.map((s) => el("th", {text: `step ${s}`})) : []));
  const flagged = new Set((state.info.flags || []).map((f) => f.method));
  const rows = entry.ranking.map((method) => {
    const m = entry.methods[method];
    const tied = (j) => (m.tied || [])[j] ? "=" : "";
    const name = el("td", {class: "gae-method", text: flagged.has(method) ? `${method} ⚠` : method});
    if (flagged.has(method)) name.title = "flagged as not faithful: see the warnings above";
    const tr = el("tr", {"data-method": method, class: isFloor(method) ? "gae-random" : ""},
                  el("td", {text: `${m.ranks[last]}${tied(last)}`}), name,
                  el("td", {text: plusMinus(m.values[last], m.stderr[last])}));
    if (history) {
      m.ranks.forEach((rank, j) => {
        const moved = j > 0 && rank !== null && m.ranks[j - 1] !== null && rank !== m.ranks[j - 1];
        const td = el("td", {text: rank === null ? "–" : `#${rank}${tied(j)}`, class: moved ? "gae-rank-moved" : ""});
        td.addEventListener("mousemove", (event) => showTip(event,
          `${method} · ${entry.metric} at step ${entry.steps[j]}: ${plusMinus(m.values[j], m.stderr[j])}`));
        td.addEventListener("mouseleave", hideTip);
        tr.append(td);
      });
    }
    return tr;
  });
  return el("table", {class: "gae-ranking", "data-metric": entry.metric}, caption, head, ...rows);
}

// The explanations flagged as not faithful (GAECallback's warnings), first: they change how the rest reads.
function flagSection(info) {
  const flags = info.flags || [];
  if (!flags.length) return [];
  const items = flags.map((f) => {
    const [head, ...details] = f.text.split("\n").filter((line) => line.trim());
    return el("li", {"data-method": f.method, "data-cause": f.cause}, el("b", {text: head.replace(/\*\*/g, "")}),
              el("ul", {}, ...details.map((line) => el("li", {text: line.replace(/^- /, "")}))));
  });
  return [el("div", {class: "gae-section gae-flagged", text: "Warnings: explanations that are not faithful"}),
          el("ul", {class: "gae-flags", id: "gae-flags"}, ...items)];
}

function summarySection(info) {
  const summary = info.summary || [];
  if (!summary.length) return flagSection(info);
  const steps = [...new Set(summary.flatMap((e) => e.steps))].sort((a, b) => a - b);
  const when = steps.length > 1 ? `scored at ${steps.length} steps (${steps.join(", ")})`
    : `scored once, at step ${steps[0]} (GAECallback's metric_every_n_explanations sets when it is scored)`;
  // Why every method ties at the last step scored (GAECallback's tie note), under the tables it explains.
  const tie = (info.ties || []).find((t) => t.step === steps[steps.length - 1]);
  const sections = [...flagSection(info),
                    el("div", {class: "gae-section", text: `Summary: the methods ranked on each metric, ${when}`}),
                    el("div", {class: "gae-summary", id: "gae-summary"}, ...summary.map(rankingTable)),
                    ...(tie ? [el("div", {class: "gae-hint", id: "gae-ties", text: `Ties at step ${tie.step}: ${tie.text}`})] : [])];
  if (steps.length > 1) {
    sections.push(el("div", {class: "gae-section", text: "Each metric over training (every step it was scored, ± its " +
                                                            "standard error where there is one; hover a point for the samples it was scored on)"}),
                  el("div", {class: "gae-histories", id: "gae-history"}, ...summary.map(historyChart)));
    if (steps.length < 10) sections.push(customScalarsLink(steps.length));
  }
  return sections;
}

// TensorBoard's Custom Scalars charts smooth every line by default (weight 0.6), which under ten points moves them
// off their values; its address takes the weight, so the link opens them unsmoothed.
function customScalarsLink(count) {
  const link = el("a", {href: "#custom_scalars&_smoothingWeight=0", id: "gae-custom-scalars", target: "_top",
                        text: "Custom Scalars, unsmoothed"});
  link.addEventListener("click", (event) => {
    event.preventDefault();
    window.parent.location.hash = "#custom_scalars&_smoothingWeight=0";
  });
  return el("div", {class: "gae-hint"}, `The same ${count} points per method in TensorBoard's charts: `, link,
            " (TensorBoard smooths its lines by default, which moves so few points off their values)");
}

// --- one colour per method, the same in every chart ---------------------------------------------

// The methods in the order the callback logs them, Captum baselines after, the floors (random) last and grey.
function methodColour(method) {
  if (isFloor(method)) return [117, 117, 117];
  const info = state.info || {};
  const known = [...(info.methods || []), ...(info.summary || []).flatMap((e) => Object.keys(e.methods))];
  const order = [...new Set(known.filter((m) => !isFloor(m)))];
  const i = order.indexOf(method);
  const palette = state.colormaps.palette;
  return palette[(i < 0 ? order.length : i) % palette.length];
}

// Room for a legend of these method names right of a chart: its line, a gap and the longest name.
function legendWidth(methods) {
  return 40 + 7 * Math.max(0, ...methods.map((m) => m.length));
}

function legend(chart, methods, x, y) {
  methods.forEach((method, i) => {
    const colour = css(methodColour(method));
    const rowY = y + 14 * i;
    chart.append(svg("line", {x1: String(x), x2: String(x + 18), y1: String(rowY), y2: String(rowY), stroke: colour,
                              "stroke-width": "2", "stroke-dasharray": isFloor(method) ? "5 4" : "none"}));
    const name = svg("text", {x: String(x + 22), y: String(rowY + 4), "data-legend": method});
    name.textContent = method;
    chart.append(name);
  });
}

// Round tick values spanning [lo, hi] (about `count` of them).
function ticks(lo, hi, count) {
  const span = hi - lo || Math.abs(hi) || 1;
  const rough = span / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= rough);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

// One metric over training: a line per method through its value at every step it was scored, each point with its
// standard error as a bar. The y axis spans every value and bar (nothing is clipped as an outlier), or
// `options.range`; `options.title` replaces the metric's name, `options.marks` ([{step, method, text}]) draws a
// red dashed line at each step where something was raised (a region's alerts), a "⚠" label per step and the
// marks' texts on hover;
// `options.note(method, j)` adds to a point's hover text.
function historyChart(entry, options = {}) {
  const methods = Object.keys(entry.methods).sort((a, b) => isFloor(a) - isFloor(b));
  // The legend sits right of the plot, as wide as the longest method name (integrated_gradients included).
  const right = Math.max(120, legendWidth(methods));
  const [width, height, left, top, bottom] = [340 + right, 260, 48, 24, 40];
  const chart = svg("svg", {width: String(width), height: String(height), class: "gae-history", "data-metric": entry.metric});
  const ends = [];
  for (const m of methods) {
    entry.methods[m].values.forEach((v, j) => {
      if (v === null) return;
      const e = entry.methods[m].stderr[j] || 0;
      ends.push(v - e, v + e);
    });
  }
  if (!ends.length) return chart;
  let [lo, hi] = [Math.min(...ends), Math.max(...ends)];
  const pad = (hi - lo || Math.abs(hi) || 1) * 0.05;
  [lo, hi] = options.range || [lo - pad, hi + pad];
  const [first, last] = [entry.steps[0], entry.steps[entry.steps.length - 1]];
  const x = (s) => left + (last === first ? 0.5 : (s - first) / (last - first)) * (width - left - right);
  const y = (v) => top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom);
  const title = svg("text", {x: String(left), y: "14"});
  title.textContent = options.title || `${entry.metric} (${entry.higher_is_better ? "↑" : "↓"})`;
  chart.append(title);
  for (const t of ticks(lo, hi, 5)) {
    chart.append(svg("line", {x1: String(x(first)), x2: String(x(last)), y1: String(y(t)), y2: String(y(t)), stroke: "#eeeeee"}));
    const label = svg("text", {x: String(left - 6), y: String(y(t) + 4), "text-anchor": "end"});
    label.textContent = format(t);
    chart.append(label);
  }
  for (const s of ticks(first, last, 5).filter((s) => Number.isInteger(s))) {
    const label = svg("text", {x: String(x(s)), y: String(height - bottom + 14), "text-anchor": "middle"});
    label.textContent = String(s);
    chart.append(label);
  }
  const xTitle = svg("text", {x: String((left + width - right) / 2), y: String(height - 8), "text-anchor": "middle"});
  xTitle.textContent = "step";
  chart.append(xTitle);
  for (const method of methods) {
    const m = entry.methods[method];
    const colour = css(methodColour(method));
    const dash = isFloor(method) ? "5 4" : "none";
    const points = entry.steps.map((s, j) => (m.values[j] === null ? null : `${x(s).toFixed(1)},${y(m.values[j]).toFixed(1)}`));
    chart.append(svg("polyline", {points: points.filter(Boolean).join(" "), fill: "none", stroke: colour, "stroke-width": "2",
                                  "stroke-dasharray": dash, "data-method": method}));
    entry.steps.forEach((s, j) => {
      const v = m.values[j];
      if (v === null) return;
      const e = m.stderr[j];
      if (e) chart.append(svg("line", {x1: String(x(s)), x2: String(x(s)), y1: String(y(v - e)), y2: String(y(v + e)),
                                       stroke: colour, "stroke-width": "1.5"}));
      const dot = svg("circle", {cx: String(x(s)), cy: String(y(v)), r: "3.5", fill: colour, "data-method": method,
                                 "data-step": String(s)});
      const n = (m.counts || [])[j];
      dot.addEventListener("mousemove", (event) => showTip(event,
        `${method} · ${entry.metric} at step ${s}: ${plusMinus(v, e)}${n ? ` (n=${n})` : ""}` +
        (options.note ? options.note(method, j) : "")));
      dot.addEventListener("mouseleave", hideTip);
      chart.append(dot);
    });
  }
  // One dashed line per mark; one "⚠" label per step, half-way up on a white halo (several alerts of a step share it).
  // Labels of nearby steps go on rows below one another instead of over one another (about 7 px per character).
  const byStep = new Map();
  for (const mark of options.marks || []) byStep.set(mark.step, [...(byStep.get(mark.step) || []), mark]);
  const rowEnds = [];
  for (const [step, marks] of [...byStep].sort((a, b) => a[0] - b[0])) {
    const at = x(step);
    const label = marks.length > 1 ? `⚠ ${marks.length} alerts` : `⚠ ${marks[0].method}`;
    let row = rowEnds.findIndex((end) => end < at);
    if (row < 0) row = rowEnds.push(0) - 1;
    rowEnds[row] = at + 4 + 7 * label.length;
    const tip = `step ${step}: ${marks.map((m) => m.text).join(", ")}`;
    const drawn = marks.map((mark) => svg("line", {x1: String(at), x2: String(at), y1: String(top), y2: String(height - bottom),
                                                   stroke: "#c62828", "stroke-width": "1.5", "stroke-dasharray": "3 3",
                                                   class: "gae-alert-mark", "data-step": String(step), "data-method": mark.method}));
    const sign = svg("text", {x: String(at + 4), y: String((top + height - bottom) / 2 + 14 * row), fill: "#c62828",
                              stroke: "#ffffff", "stroke-width": "3", "paint-order": "stroke", class: "gae-alert-label",
                              "data-step": String(step)});
    sign.textContent = label;
    for (const target of [...drawn, sign]) {
      target.addEventListener("mousemove", (event) => showTip(event, tip));
      target.addEventListener("mouseleave", hideTip);
    }
    chart.append(...drawn, sign);
  }
  legend(chart, methods, width - right + 12, top + 4);
  return chart;
}

// --- declared regions: how much of each method's relevance sits on them, and the alerts ------------------------

// One chart per region (its share of every method's relevance over training, random the dashed floor) with the
// alerts of that region marked at their steps, then the alerts themselves (GAECallback's warnings).
function regionSection(info) {
  const regions = info.regions || [];
  const alerts = info.alerts || [];
  if (!regions.length && !alerts.length) return [];
  const charts = regions.filter((r) => r.share).map((r) => {
    const methods = Object.fromEntries(Object.entries(r.share.methods).map(([m, values]) => {
      const recall = ((r.recall || {}).methods || {})[m] || [];
      const recallAt = r.share.steps.map((s) => {
        const j = ((r.recall || {}).steps || []).indexOf(s);
        return j < 0 ? null : recall[j];
      });
      return [m, {values, stderr: values.map(() => null), counts: [], recall: recallAt}];
    }));
    const note = (method, j) => {
      const recall = methods[method].recall[j];
      return recall === null || recall === undefined ? "" : `; recall of its tokens in the top k: ${format(recall)}`;
    };
    const marks = alerts.filter((a) => a.region === r.region).map((a) => {
      const share = (a.text.match(/(\d+%) of /) || [])[1];
      return {step: a.step, method: a.method, text: `alert: ${share ? `${share} of ${a.method}'s relevance` : a.method} on "${r.region}"`};
    });
    const chart = historyChart({metric: `region_share_${r.region}`, higher_is_better: false, steps: r.share.steps, methods},
                               {range: [0, 1], marks, note, title: `share of relevance on "${r.region}"`});
    chart.dataset.region = r.region;
    return chart;
  });
  const sections = [el("div", {class: "gae-section", text: "Declared regions: the share of each method's positive " +
                                                          "relevance on each region over training (random: the floor; " +
                                                          "⚠ where a suspect region raised an alert)"}),
                    el("div", {class: "gae-histories", id: "gae-regions"}, ...charts)];
  if (alerts.length) {
    const items = alerts.map((a) => {
      const [head, ...details] = a.text.split("\n").filter((line) => line.trim());
      return el("li", {"data-region": a.region, "data-method": a.method}, el("b", {text: head.replace(/\*\*/g, "")}),
                el("ul", {}, ...details.map((line) => el("li", {text: line.replace(/^- /, "")}))));
    });
    sections.push(el("div", {class: "gae-section gae-flagged", text: "Alerts: declared regions whose share differs from chance, or that are not scored"}),
                  el("ul", {class: "gae-flags", id: "gae-alerts"}, ...items));
  }
  return sections;
}

// --- faithfulness curves ------------------------------------------------------------------------

function curveChart(metric, byMethod) {
  const methods = Object.keys(byMethod).sort((a, b) => isFloor(a) - isFloor(b) || a.localeCompare(b));
  // The legend sits right of the plot (inside it, it covered the curves' ends).
  const right = legendWidth(methods);
  const [width, height, left, top, bottom] = [376 + right, 250, 44, 24, 40];
  const chart = svg("svg", {width: String(width), height: String(height), class: "gae-curve", "data-metric": metric});
  const all = methods.flatMap((m) => byMethod[m].values.filter((v) => v !== null));
  const ymax = Math.max(1, ...all);
  const x = (f) => left + f * (width - left - right);
  const y = (v) => top + (1 - v / ymax) * (height - top - bottom);
  const title = svg("text", {x: String(left), y: "14"});
  title.textContent = metric;
  chart.append(title);
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(svg("line", {x1: String(x(0)), x2: String(x(1)), y1: String(y(tick * ymax)), y2: String(y(tick * ymax)), stroke: "#eeeeee"}));
    const label = svg("text", {x: String(left - 6), y: String(y(tick * ymax) + 4), "text-anchor": "end"});
    label.textContent = format(tick * ymax);
    chart.append(label);
    const xl = svg("text", {x: String(x(tick)), y: String(height - bottom + 14), "text-anchor": "middle"});
    xl.textContent = `${Math.round(tick * 100)}%`;
    chart.append(xl);
  }
  const xTitle = svg("text", {x: String((left + width - right) / 2), y: String(height - 8), "text-anchor": "middle"});
  xTitle.textContent = "fraction removed";
  chart.append(xTitle);
  for (const method of methods) {
    const {fractions, values} = byMethod[method];
    const colour = methodColour(method);
    const points = fractions.map((f, j) => (values[j] === null ? null : `${x(f).toFixed(1)},${y(values[j]).toFixed(1)}`)).filter(Boolean);
    chart.append(svg("polyline", {points: points.join(" "), fill: "none", stroke: css(colour), "stroke-width": "2",
                                  "stroke-dasharray": isFloor(method) ? "5 4" : "none", "data-method": method}));
  }
  legend(chart, methods, width - right + 12, top + 4);
  return chart;
}

// --- the page -----------------------------------------------------------------------------------

function status(message) {
  state.ui.status.textContent = message || "";
}

async function stepData(step) {
  const key = `${state.run}\u0000${step}`;
  if (!state.steps.has(key)) {
    state.steps.set(key, getJSON(`step?run=${encodeURIComponent(state.run)}&step=${step}`));
  }
  try {
    return await state.steps.get(key);
  } catch (error) {
    state.steps.delete(key);
    throw error;
  }
}

// The entries of the run (or of this step) that could not be read: each is left out, and says why.
function problemSection(problems) {
  if (!problems || !problems.length) return [];
  const items = problems.map((e) => el("li", {"data-tag": e.tag},
    `${e.tag}${e.step === undefined ? "" : ` (step ${e.step})`}: ${e.why}`));
  const text = problems.length === 1 ? "1 entry of this run could not be read; it is left out, the rest is drawn"
    : `${problems.length} entries of this run could not be read; they are left out, the rest is drawn`;
  return [el("div", {class: "gae-section gae-flagged", text}),
          el("ul", {class: "gae-flags", id: "gae-problems"}, ...items)];
}

// What the run has besides pictures: the summary, the regions, the entries that could not be read.
function runSections(info) {
  return [...problemSection(info.problems), ...summarySection(info), ...regionSection(info)];
}

// A run with scores or regions but no explanation step yet (fit ended before the first validation, or is still
// running): what it has, and why there are no pictures.
function drawWithoutPictures(info) {
  const has = (info.summary || []).length || (info.regions || []).length || (info.flags || []).length;
  const message = `No pictures were logged yet in run "${info.run}": GAECallback draws the tracked samples at each ` +
    "explanation step (every_n_epochs / every_n_steps, at validation); this run has none" +
    (has ? ", only the scores below" : "") + `. The tab checks again every ${POLL_MS / 1000} s while it is open.`;
  state.ui.stepLabel.textContent = "no explanation step yet";
  state.ui.main.replaceChildren(el("div", {class: "gae-hint", id: "gae-no-pictures", text: message}), ...runSections(info));
  state.ui.root.dataset.renderedStep = "none";
}

// One sample's block; a sample that cannot be drawn costs itself alone and says why.
function sampleBlock(sample, at) {
  try {
    const body = sample.sets ? setsSample(sample, at) : modalitySample(sample, at.relevance);
    return el("div", {class: "gae-sample", "data-sample": String(sample.sample)},
              el("div", {class: "gae-sample-title", text: sampleTitle(sample, at)}), body);
  } catch (error) {
    console.warn(error);
    return el("div", {class: "gae-sample gae-flagged", "data-sample": String(sample.sample)},
              el("div", {class: "gae-sample-title", text: `val #${sample.sample}`}),
              el("div", {class: "gae-empty-text", text: `not drawn: ${error.message || error}`}));
  }
}

async function draw() {
  const info = state.info;
  if (!info) return;
  if (!info.steps.length) {
    drawWithoutPictures(info);
    return;
  }
  const step = info.steps[state.stepIndex];
  state.ui.stepLabel.textContent = `step ${step} (${state.stepIndex + 1} of ${info.steps.length})`;
  const data = await stepData(step);
  if (info !== state.info || step !== info.steps[state.stepIndex]) return; // a newer choice was made meanwhile
  const grid = el("div", {id: "gae-samples"});
  for (const sample of info.samples) {
    const at = data.samples[String(sample.sample)];
    if (at) grid.append(sampleBlock(sample, at));
  }
  const stepProblems = (data.problems || []).filter((e) => !(info.problems || []).some((r) => r.tag === e.tag && r.step === e.step));
  const sections = [...problemSection([...(info.problems || []), ...stepProblems]), ...summarySection(info)];
  const curves = el("div", {class: "gae-curves"});
  for (const metric of Object.keys(data.curves).sort()) curves.append(curveChart(metric, data.curves[metric]));
  if (curves.childElementCount) {
    sections.push(el("div", {class: "gae-section", text: `Faithfulness curves at step ${step} (score vs fraction of the input removed, most relevant first for positive perturbation)`}), curves);
  } else if ((info.curve_steps || []).length) {
    // GAECallback scores its faithfulness subset at some steps only (by default once, when fit ends).
    const at = info.curve_steps.join(", ");
    sections.push(el("div", {class: "gae-hint", text: `Faithfulness curves: none at step ${step}; scored at step ${at} (move the step slider there)`}));
  }
  sections.push(...regionSection(info));
  sections.push(el("div", {class: "gae-section", text: `Tracked samples at step ${step} (${scaleNote()})`}), grid);
  state.ui.main.replaceChildren(...sections);
  state.ui.root.dataset.renderedStep = String(step);
}

function redraw() {
  draw().then(() => status(""), (error) => {
    console.error(error);
    status(String(error.message || error));
  });
}

// The run the URL names: TensorBoard keeps the tab's state in the page's hash (`#gae&run=NAME`; its plugins'
// convention `#gae&p.gae.run=NAME` works too), and a query parameter `?run=NAME` of the page is read as well.
function urlRun() {
  let page;
  try {
    page = window.parent.location;
  } catch (error) {
    page = window.location;
  }
  for (const part of [page.hash.replace(/^#/, ""), page.search.replace(/^\?/, "")]) {
    const params = new URLSearchParams(part.replace(/^[^&=]*&/, "&"));
    const run = params.get("run") || params.get("p.gae.run");
    if (run) return run;
  }
  return null;
}

// Keep the run shown in the page's hash, so that the address (a bookmark, a reload) opens it again.
function rememberRun(run) {
  try {
    const page = window.parent.location;
    const hash = page.hash.replace(/^#/, "").split("&").filter((p) => p && !p.startsWith("run=") && !p.startsWith("p.gae.run="));
    const tab = hash.length && !hash[0].includes("=") ? [] : ["gae"];
    const next = `#${[...tab, ...hash, `run=${encodeURIComponent(run)}`].join("&")}`;
    if (page.hash !== next) window.parent.history.replaceState(window.parent.history.state, "", next);
  } catch (error) {
    console.warn(error);
  }
}

function applyInfo(info, keepStep) {
  const atLast = state.info ? state.stepIndex >= state.info.steps.length - 1 : true;
  const step = state.info ? state.info.steps[state.stepIndex] : undefined;
  state.info = info;
  const kept = keepStep && !atLast ? info.steps.indexOf(step) : -1;
  state.stepIndex = kept >= 0 ? kept : Math.max(0, info.steps.length - 1);
  const slider = state.ui.slider;
  slider.max = String(Math.max(0, info.steps.length - 1));
  slider.value = String(state.stepIndex);
  slider.disabled = info.steps.length < 2;
}

async function selectRun(run) {
  state.run = run;
  for (const part of state.ui.runControls) part.hidden = false;
  state.info = null;
  state.ui.main.replaceChildren();
  const info = await getJSON(`run?run=${encodeURIComponent(run)}`);
  if (state.run !== run) return;
  applyInfo(info, false);
  state.ui.runSelect.value = run;
  rememberRun(run);
  await draw();
}

// Ask again for the runs and the run shown: a run still being written gets new steps, scores and pictures.
async function poll() {
  const runs = (await getJSON("runs")).runs;
  if (runs.join("\u0000") !== state.runs.join("\u0000")) {
    state.runs = runs;
    state.ui.runSelect.replaceChildren(...runs.map((r) => el("option", {value: r, text: r})));
    if (state.run) state.ui.runSelect.value = state.run;
  }
  if (!state.run) {
    if (runs.length) await selectRun(chooseRun(runs));
    return;
  }
  const info = await getJSON(`run?run=${encodeURIComponent(state.run)}`);
  const before = state.info;
  if (!before || info.run !== state.run || JSON.stringify(info) === JSON.stringify(before)) return;
  const added = info.steps.filter((s) => !before.steps.includes(s));
  applyInfo(info, true);
  state.ui.updated.textContent = `run "${info.run}" is still being written: ` +
    (added.length ? `step ${added.join(", ")} arrived` : "new entries arrived") + ` at ${new Date().toLocaleTimeString()}`;
  await draw();
}

function chooseRun(runs) {
  const wanted = urlRun();
  if (wanted && runs.includes(wanted)) return wanted;
  if (wanted) status(`run "${wanted}" (from the address) has no GAE data; showing "${runs[runs.length - 1]}"`);
  return runs[runs.length - 1];
}

function controls() {
  const runSelect = el("select", {id: "gae-run", onchange: (e) => selectRun(e.target.value).catch((error) => status(String(error.message)))});
  const slider = el("input", {type: "range", id: "gae-step", min: "0", max: "0", step: "1", value: "0",
                              oninput: (e) => { state.stepIndex = Number(e.target.value); redraw(); }});
  const stepLabel = el("span", {id: "gae-step-label"});
  const cmapSelect = el("select", {id: "gae-colormap", onchange: (e) => { state.colormap = e.target.value; redraw(); }},
    el("option", {value: "auto", text: "auto (RdBu_r for signed methods, inferno for non-negative ones)"}),
    ...Object.keys(state.colormaps.sequential).map((n) => el("option", {value: n, text: n})),
    ...Object.keys(state.colormaps.diverging).map((n) => el("option", {value: n, text: `${n} (diverging)`})));
  const opacity = el("input", {type: "range", id: "gae-opacity", min: "0", max: "1", step: "0.05", value: String(state.opacity),
                               title: "1: every colour is the colour bar's; lower shows the greyscale input through the heatmap " +
                                      "(the colours then leave the bar)",
                               oninput: (e) => { state.opacity = Number(e.target.value); redraw(); }});
  const scale = el("select", {id: "gae-scale", onchange: (e) => { state.scale = e.target.value; redraw(); }},
    el("option", {value: "map", text: "each map by its own maximum"}),
    el("option", {value: "shared", text: "shared by the methods of a sample"}),
    el("option", {value: "run", text: "each method by its maximum over all steps"}));
  Object.assign(state.ui, {runSelect, slider, stepLabel});
  return el("div", {class: "gae-controls"},
    el("label", {}, "run", runSelect),
    el("label", {}, "step", slider, stepLabel),
    el("label", {}, "colormap", cmapSelect),
    el("label", {}, "heatmap opacity", opacity),
    el("label", {}, "colour scale", scale));
}

function startPolling() {
  setInterval(() => poll().catch((error) => console.warn(error)), POLL_MS);
}

export async function render() {
  document.head.append(el("style", {text: STYLE}));
  const root = el("div", {id: "gae-dashboard"});
  const statusLine = el("div", {class: "gae-status"});
  const updated = el("div", {class: "gae-hint", id: "gae-updated"});
  const main = el("div", {id: "gae-main"});
  const tooltip = el("div", {id: "gae-tooltip"});
  Object.assign(state.ui, {root, status: statusLine, updated, main, tooltip});
  document.body.append(root, tooltip);
  try {
    const [runs, colormaps] = await Promise.all([getJSON("runs"), getJSON("colormaps")]);
    state.colormaps = colormaps;
    state.runs = runs.runs;
    // The controls and the hint mean nothing before a run exists: hidden until selectRun shows them.
    const bar = controls(), hint = el("div", {class: "gae-hint", id: "gae-hover-hint", text:
      "Hover a patch, pixel, token or feature to read its relevance. " +
      "Move the step slider (or use the arrow keys) to replay training."});
    bar.hidden = hint.hidden = true;
    Object.assign(state.ui, {runControls: [bar, hint]});
    root.append(bar, statusLine, updated, hint, main);
    startPolling();
    if (!state.runs.length) {
      main.replaceChildren(el("div", {class: "gae-hint", id: "gae-no-run", text:
        "No run with GAE data in this logdir yet: train with lightning_gae.callbacks.GAECallback and a " +
        "TensorBoardLogger writing under this logdir. A run that is still training appears here at its first " +
        `explanation step or score (the tab checks every ${POLL_MS / 1000} s).`}));
      root.dataset.renderedStep = "none";
      return;
    }
    state.ui.runSelect.replaceChildren(...state.runs.map((r) => el("option", {value: r, text: r})));
    await selectRun(chooseRun(state.runs));
  } catch (error) {
    console.error(error);
    if (!statusLine.isConnected) root.append(statusLine);
    status(String(error.message || error));
  }
}
