// The attention explorer: asks POST /v1/encode for every layer and head (float16,
// causal-packed: a quarter of the float32 bytes), then draws one view on a canvas. It can
// compare: the same text through two models, or two texts through one model, side by side
// with the same layer, head and view, and a difference map where the two have as many tokens.
// No build step, no dependencies; the URL carries the state so a view can be shared:
//   /?text=...&layer=2&head=5&view=rollout&rows=all&model=a&compare=model&model_b=b
"use strict";

const $ = (id) => document.getElementById(id);
// panes.a and panes.b: { packed, tokens, model, text } once encoded; b only when comparing.
// predictions: pane a's next-token distribution and logit lens, with every head on.
// off: the heads switched off, "layer.head" (in the URL as off=1.2,0.3); every view shows
// the model without them.
// saes: the served model's sparse autoencoders (GetModelInfo's), features the request their
// bars came from, traced the feature followed across the text (feature= in the URL).
const state = {
  panes: { a: null, b: null }, kvHeads: null, predictions: null, predictionsKey: null,
  off: new Set(), bosId: null, saes: [], features: null, traced: null,
};

// ---- the wire format: base64 little-endian float16, causal-packed [L, H, T(T+1)/2] ----

function float16ToFloat32(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

function decodeTensor(tensor) {
  const bytes = Uint8Array.from(atob(tensor.data || ""), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(bytes.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = float16ToFloat32(view.getUint16(2 * i, true));
  return { shape: tensor.shape.map(Number), values: out };
}

// Row i of a packed head starts at i(i+1)/2 and holds keys 0..i.
function headMatrix(packed, layer, head, t) {
  const [, heads, perHead] = packed.shape;
  const base = (layer * heads + head) * perHead;
  const m = new Float32Array(t * t);
  for (let i = 0, k = base; i < t; i++) for (let j = 0; j <= i; j++, k++) m[i * t + j] = packed.values[k];
  return m;
}

// ---- views ----

function reduceHeads(packed, layer, t, how) {
  const heads = packed.shape[1];
  const out = new Float32Array(t * t).fill(how === "max" ? -Infinity : 0);
  for (let h = 0; h < heads; h++) {
    const m = headMatrix(packed, layer, h, t);
    for (let k = 0; k < m.length; k++) out[k] = how === "max" ? Math.max(out[k], m[k]) : out[k] + m[k] / heads;
  }
  return out;
}

// Abnar & Zuidema: A' = 0.5 A + 0.5 I (heads averaged), rows renormalised,
// R = A'_layer ... A'_0 (the first layer rightmost). It stays lower triangular.
function rollout(packed, upTo, t) {
  let r = null;
  for (let l = 0; l <= upTo; l++) {
    const a = reduceHeads(packed, l, t, "mean");
    for (let i = 0; i < t; i++) {
      a[i * t + i] += 1;
      let sum = 0;
      for (let j = 0; j <= i; j++) sum += a[i * t + j];
      for (let j = 0; j <= i; j++) a[i * t + j] /= sum;
    }
    r = r === null ? a : matmulCausal(a, r, t);
  }
  return r;
}

function matmulCausal(a, b, t) {  // both lower triangular
  const out = new Float32Array(t * t);
  for (let i = 0; i < t; i++)
    for (let k = 0; k <= i; k++) {
      const aik = a[i * t + k];
      if (aik) for (let j = 0; j <= k; j++) out[i * t + j] += aik * b[k * t + j];
    }
  return out;
}

function meanRowEntropy(m, t) {
  let total = 0;
  for (let i = 0; i < t; i++) {
    let h = 0;
    for (let j = 0; j <= i; j++) { const p = m[i * t + j]; if (p > 0) h -= p * Math.log(p); }
    total += h;
  }
  return total / t;
}

// The matrix the controls select, of one encoding; null if it has no such layer or head.
function viewOf(encoding) {
  const { packed, tokens } = encoding;
  const t = tokens.length;
  const [layers, heads] = packed.shape;
  const layer = Number($("layer").value), head = Number($("head").value), view = $("view").value;
  if (layer >= layers || (view === "head" && head >= heads)) return null;
  const full =
    view === "head" ? headMatrix(packed, layer, head, t)
    : view === "rollout" ? rollout(packed, layer, t)
    : reduceHeads(packed, layer, t, view);
  const rowIndex = $("rows").value === "last" ? [t - 1] : [...Array(t).keys()];
  return { full, rowIndex, t, tokens };
}

function comparing() {
  return $("compare").value !== "" && state.panes.b !== null;
}

// ---- drawing ----

function colour(v) {  // white -> deep blue
  const x = Math.max(0, Math.min(1, v));
  return `rgb(${Math.round(255 - 215 * x)},${Math.round(255 - 170 * x)},${Math.round(255 - 60 * x)})`;
}

// The colour scale under the map: colours run from 0 (white) to the largest weight shown.
function showScale(peak) {
  $("scale-bar").style.background = `linear-gradient(to right, ${colour(0)}, ${colour(0.5)}, ${colour(1)})`;
  $("scale-max").textContent = peak.toFixed(3);
  $("scale").dataset.peak = String(peak);
  $("scale").hidden = false;
}

function diverging(v) {  // -1 blue .. 0 white .. 1 red
  const x = Math.max(-1, Math.min(1, v));
  return x >= 0
    ? `rgb(255,${Math.round(255 - 170 * x)},${Math.round(255 - 190 * x)})`
    : `rgb(${Math.round(255 + 190 * x)},${Math.round(255 + 120 * x)},255)`;
}

// One map on one canvas; `signed` maps draw differences. Returns the map's geometry.
function drawMap(canvas, view, signed, highlight) {
  const { full, rowIndex, t, tokens } = view;
  const cell = Math.max(2, Math.min(24, Math.floor(760 / t)));
  const labels = cell >= 8;
  const margin = labels ? 70 : 4;
  canvas.width = margin + cell * t + 4;
  canvas.height = margin + cell * rowIndex.length + 4;
  canvas.dataset.rows = String(rowIndex.length);
  canvas.dataset.cols = String(t);
  canvas.dataset.view = $("view").value;
  canvas.dataset.cell = String(cell);  // the layout, for tools that point at a cell
  canvas.dataset.margin = String(margin);
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, canvas.width, canvas.height);
  let peak = 0;
  for (const i of rowIndex) for (let j = 0; j <= i; j++) peak = Math.max(peak, Math.abs(full[i * t + j]));
  canvas.dataset.peak = String(peak);
  rowIndex.forEach((i, r) => {
    for (let j = 0; j < t; j++) {
      const v = full[i * t + j] / (peak || 1);
      g.fillStyle = j > i ? "#f4f4f4" : signed ? diverging(v) : colour(v);
      g.fillRect(margin + j * cell, margin + r * cell, cell, cell);
    }
  });
  if (highlight) {
    g.strokeStyle = "#e4572e";
    g.lineWidth = 2;
    const r = rowIndex.indexOf(highlight.row);
    if (r >= 0) g.strokeRect(margin, margin + r * cell, cell * t, cell);
    if (highlight.col !== null && highlight.col < t) g.strokeRect(margin + highlight.col * cell, margin, cell, cell * rowIndex.length);
  }
  if (labels) {
    g.fillStyle = "#1d1d1f";
    g.font = `${Math.min(12, cell)}px ui-monospace, monospace`;
    g.textAlign = "right";
    g.textBaseline = "middle";
    rowIndex.forEach((i, r) => g.fillText(tokens[i], margin - 4, margin + (r + 0.5) * cell));
    g.save();
    g.textAlign = "left";
    for (let j = 0; j < t; j++) {
      g.setTransform(1, 0, 0, 1, margin + (j + 0.5) * cell, margin - 4);
      g.rotate(-Math.PI / 2);
      g.fillText(tokens[j], 0, 0);
    }
    g.restore();
  }
  return { cell, margin, rowIndex, t, full, tokens, peak };
}

// One head's map at thumbnail size: no labels, colours scaled to its own largest weight.
function drawSmall(canvas, full, t) {
  const cell = Math.max(1, Math.floor(96 / t));
  canvas.width = canvas.height = cell * t;
  let peak = 0;
  for (let i = 0; i < t; i++) for (let j = 0; j <= i; j++) peak = Math.max(peak, full[i * t + j]);
  const g = canvas.getContext("2d");
  for (let i = 0; i < t; i++) {
    for (let j = 0; j < t; j++) {
      g.fillStyle = j > i ? "#f4f4f4" : colour(full[i * t + j] / (peak || 1));
      g.fillRect(j * cell, i * cell, cell, cell);
    }
  }
  canvas.dataset.peak = String(peak);
}

// Every head of the selected layer side by side (small multiples, as CircuitsVis and
// bertviz show them); a click enlarges one in the map below.
function drawHeads() {
  const box = $("heads");
  box.innerHTML = "";
  const pane = state.panes.a;
  if (!pane) return;
  const { packed, tokens } = pane;
  const t = tokens.length, [layers, heads] = packed.shape;
  const layer = Number($("layer").value);
  if (layer >= layers) return;
  $("heads-caption").textContent = `layer ${layer}, every head (click one to enlarge it):`;
  for (let h = 0; h < heads; h++) {
    const figure = box.appendChild(document.createElement("figure"));
    const canvas = figure.appendChild(document.createElement("canvas"));
    drawSmall(canvas, headMatrix(packed, layer, h, t), t);
    const off = state.off.has(`${layer}.${h}`);
    figure.appendChild(document.createElement("figcaption")).textContent = headLabel(h) + (off ? " off" : "");
    figure.classList.toggle("off", off);
    Object.assign(canvas.dataset, { layer, head: h });
    canvas.title = `layer ${layer}, head ${h}: click to enlarge`;
    canvas.classList.toggle("selected", $("view").value === "head" && Number($("head").value) === h);
    canvas.onclick = () => { $("head").value = String(h); $("view").value = "head"; update(); };
  }
}

// The switched-off heads as [layer, head] pairs, in order.
function offList() {
  return [...state.off].map((key) => key.split(".").map(Number))
    .sort((x, y) => x[0] - y[0] || x[1] - y[1]);
}

function offLabel() {
  const off = offList();
  return off.length ? `, without ${off.map(([l, h]) => `L${l}H${h}`).join(", ")}` : "";
}

function caption(pane) {
  const p = state.panes[pane];
  if (!p) return "";
  const text = JSON.stringify(p.text.length > 60 ? p.text.slice(0, 57) + "..." : p.text);
  return `${p.model}: ${text}${p.off ? offLabel() : ""}`;
}

// Every map with the controls' layer, head and view: the first, the second and their
// difference when comparing. state.maps keeps each map's geometry, for hovering.
function draw(highlight = null) {
  if (!state.panes.a) return;
  state.maps = {};
  const a = viewOf(state.panes.a);
  $("caption-a").textContent = caption("a") + (a ? "" : ": no such layer or head");
  if (a) {
    state.maps.a = drawMap($("heatmap"), a, false, highlight);
    showScale(state.maps.a.peak);
  }
  const compare = comparing();
  $("pane-b").hidden = !compare;
  $("pane-diff").hidden = true;
  $("diff-note").hidden = true;
  if (!compare) return;
  const b = viewOf(state.panes.b);
  $("caption-b").textContent = caption("b") + (b ? "" : ": no such layer or head");
  if (b) state.maps.b = drawMap($("heatmap-b"), b, false, highlight);
  if (a && b && a.t === b.t) {
    const diff = { ...a, full: a.full.map((v, k) => v - b.full[k]) };
    state.maps.diff = drawMap($("heatmap-diff"), diff, true, highlight);
    $("pane-diff").hidden = false;
  } else if (a && b) {
    $("diff-note").textContent = `No difference map: the first has ${a.t} tokens, the second ${b.t}.`;
    $("diff-note").hidden = false;
  }
}

function weightAt(map, row, col) {
  return map && row < map.t && col <= row ? map.full[row * map.t + col] : null;
}

// Hovering a cell of any map lights up its row and column in every map, and says the weight
// of each (and the difference).
function hover(event, which) {
  const geo = state.maps && state.maps[which];
  if (!geo) return;
  const rect = event.target.getBoundingClientRect();
  const x = event.clientX - rect.left - geo.margin, y = event.clientY - rect.top - geo.margin;
  let col = Math.floor(x / geo.cell), r = Math.floor(y / geo.cell);
  // Over a label: the token's own row and column.
  if (x < 0 && r >= 0 && r < geo.rowIndex.length) col = geo.rowIndex[r];
  if (y < 0 && col >= 0 && col < geo.t) r = Math.max(0, geo.rowIndex.indexOf(col));
  if (col < 0 || col >= geo.t || r < 0 || r >= geo.rowIndex.length) return;
  const row = geo.rowIndex[r];
  const info = $("hover-info");
  const weights = {};
  for (const [name, map] of Object.entries(state.maps)) {
    const w = weightAt(map, row, col);
    if (w !== null) weights[name] = w;
  }
  const label = { a: "first", b: "second", diff: "difference" };
  const parts = Object.entries(weights).map(([name, w]) =>
    (Object.keys(weights).length > 1 ? `${label[name]} ` : "") + w.toFixed(4));
  info.textContent =
    `query ${row} ${JSON.stringify(geo.tokens[row])} -> key ${col} ${JSON.stringify(geo.tokens[col])}: ${parts.join(", ")}`;
  info.dataset.row = String(row);
  info.dataset.col = String(col);
  for (const name of ["a", "b", "diff"]) {
    if (name in weights) info.dataset[name] = String(weights[name]);
    else delete info.dataset[name];
  }
  draw({ row, col });
}

function drawEntropy() {
  const { packed, tokens } = state.panes.a;
  const [layers, heads] = packed.shape;
  const t = tokens.length;
  const table = $("entropy");
  table.innerHTML = "";
  const header = table.insertRow();
  header.appendChild(document.createElement("th")).textContent = "L\\H";
  for (let h = 0; h < heads; h++) {
    const th = header.appendChild(document.createElement("th"));
    th.textContent = h;
    if (state.kvHeads) {
      th.title = `reads KV head ${state.kvHeads[h]}`;
      th.dataset.kv = state.kvHeads[h];
    }
  }
  if (state.kvHeads) {  // a second header row: the KV group of each head
    const groups = table.insertRow();
    groups.appendChild(document.createElement("th")).textContent = "kv";
    for (let h = 0; h < heads; h++) groups.appendChild(document.createElement("th")).textContent = state.kvHeads[h];
  }
  const worst = Math.log(Math.max(2, t));
  for (let l = 0; l < layers; l++) {
    const tr = table.insertRow();
    tr.appendChild(document.createElement("th")).textContent = l;
    for (let h = 0; h < heads; h++) {
      const e = meanRowEntropy(headMatrix(packed, l, h, t), t);
      const td = tr.insertCell();
      td.textContent = e.toFixed(2);
      td.style.background = colour(1 - e / worst);
      td.dataset.layer = l;
      td.dataset.head = h;
      td.onclick = () => { $("layer").value = l; $("head").value = h; $("view").value = "head"; update(); };
    }
  }
}

function markSelected() {
  for (const td of $("entropy").querySelectorAll("td")) {
    const on = $("view").value === "head" && td.dataset.layer === $("layer").value && td.dataset.head === $("head").value;
    td.classList.toggle("selected", on);
  }
}

// ---- state in the URL ----

// Each control and its URL parameter.
const URL_PARAMS = {
  text: "text", layer: "layer", head: "head", view: "view", rows: "rows",
  "model-a": "model", compare: "compare", "model-b": "model_b", "text-b": "text_b",
  target: "target", sae: "sae",
};

function saveUrl() {
  const params = new URLSearchParams();
  const how = $("compare").value;
  for (const [id, name] of Object.entries(URL_PARAMS)) {
    if ((id === "model-b" && how !== "model") || (id === "text-b" && how !== "text")) continue;
    if ($(id).value) params.set(name, $(id).value);
  }
  if (state.off.size) params.set("off", offList().map(([l, h]) => `${l}.${h}`).join(","));
  if (state.traced !== null) params.set("feature", state.traced);
  history.replaceState(null, "", "?" + params.toString());
}

// What a compare setting shows: the second model picker, or the second text.
function showCompareInputs() {
  const how = $("compare").value;
  $("model-b-label").hidden = how !== "model";
  $("text-b").hidden = how !== "text";
}

function update() {
  saveUrl();
  if (longMode() !== Boolean(state.long) || (longMode() && state.long && !sameHead())) {
    show();  // a view of the other kind, or another head of a long text: asked afresh
    return;
  }
  draw();
  drawHeads();
  markSelected();
}

function fillSelect(id, n, wanted) {
  const select = $(id);
  const keep = wanted ?? select.value;
  select.innerHTML = "";
  for (let i = 0; i < n; i++) select.add(new Option(id === "head" ? headLabel(i) : String(i), String(i)));
  select.value = Number(keep) < n ? String(keep) : "0";
}

// ---- talking to the server ----

// A server started with --auth-token answers 401 until the page sends its token. The page
// asks for it in a form, keeps it in this tab's session storage (never in the URL, which is
// shared), and sends it as a bearer token from then on.
const TOKEN_KEY = "attnserve-token";

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

class Unauthorized extends Error {}

function askForToken(message) {
  $("auth").hidden = false;
  $("token").focus();
  $("status").className = "error";
  $("status").textContent = message;
}

async function useToken(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  $("auth").hidden = true;
  await loadModels();
  await loadModelInfo();
  await show();
}

// `seconds`: the call's deadline (Request-Timeout), where the server's default is too short.
async function post(path, body, seconds) {
  const deadline = seconds ? { "Request-Timeout": String(seconds) } : {};
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...deadline, ...authHeaders() },
    body: JSON.stringify(body),
  });
  const json = await response.json();
  if (response.status === 401) throw new Unauthorized(json.error.message);
  if (!response.ok) throw new Error(json.error ? json.error.message : response.statusText);
  return json;
}

// The model's name and shape; under grouped-query attention (fewer key/value heads than
// query heads) each head is labelled with the KV head it reads: heads of one group share keys.
async function loadModelInfo() {
  try {
    const model = encodeURIComponent($("model-a").value);
    const response = await fetch(`/v1/model-info?model=${model}`, { headers: authHeaders() });
    if (!response.ok) return;
    const info = await response.json();
    const grouped = info.nKvHeads < info.nHeads;
    state.kvHeads = grouped ? info.kvHeads : null;
    state.bosId = info.bosId === undefined ? null : Number(info.bosId);
    state.saes = info.saes || [];
    fillSaes();
    fillTranscoderSets(info.transcoderSets || []);  // graph.js
    $("model").textContent = info.name;
    $("model-shape").textContent = `${info.nLayers} layers, ${info.nHeads} heads` +
      (grouped ? `, ${info.nKvHeads} KV head${info.nKvHeads > 1 ? "s" : ""} (grouped-query)` : "");
    if (!state.panes.a) {  // the long view asks for one head: the model's, before any map
      const params = new URLSearchParams(location.search);
      fillSelect("layer", info.nLayers, params.get("layer"));
      fillSelect("head", info.nHeads, params.get("head"));
    }
    if (state.panes.a) fillSelect("head", state.panes.a.packed.shape[1]);
    if (state.panes.a) drawEntropy();
  } catch (_) { /* the page still works without the name */ }
}

// The served models, into both pickers (the URL's choices kept); false if the server
// wants a token first.
async function loadModels() {
  const params = new URLSearchParams(location.search);
  const response = await fetch("/v1/models", { headers: authHeaders() });
  if (response.status === 401) return false;
  if (!response.ok) return true;
  const names = (await response.json()).data.map((m) => m.id);
  for (const [id, param] of [["model-a", "model"], ["model-b", "model_b"]]) {
    const select = $(id);
    const keep = params.get(param) || select.value;
    select.innerHTML = "";
    for (const name of names) select.add(new Option(name, name));
    if (names.includes(keep)) select.value = keep;
    else if (id === "model-b" && names.length > 1) select.value = names[1];
  }
  return true;
}

// The head mask of some switched-off heads, as the API takes it.
function headMask(off) {
  return off.map(([layer, head]) => ({ layer, head, scale: 0 }));
}

// One text through one model: every layer and head, float16, causal-packed; without the
// switched-off heads where `off` names any.
async function encode(model, text, off = []) {
  const options = {
    skipTokenEmbeddings: true,
    returnTokens: true,
    truncation: "TRUNCATION_RIGHT",
    attention: { dtype: "DTYPE_FLOAT16", layout: "ATTENTION_LAYOUT_CAUSAL_PACKED" },
  };
  if (off.length) options.headMask = headMask(off);
  const answer = await post("/v1/encode", { model, inputs: [{ text }], options });
  const result = answer.results[0];
  const encoding = {
    packed: decodeTensor(result.attention), tokens: result.tokens, model, text, off: off.length > 0,
  };
  return { encoding, result, ms: Number(answer.timings.totalNs) / 1e6 };
}

// ---- beyond attention: the logit lens, and heads switched off ----
// A request of its own: a model without the lens graph still shows its attention.

function decodeNumbers(tensor) {  // float32 or int32, base64 little-endian
  const bytes = Uint8Array.from(atob(tensor.data || ""), (c) => c.charCodeAt(0));
  return tensor.dtype === "DTYPE_INT32" ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer);
}

// The next-token distribution after the last token (logits, softmaxed here) and the logit
// lens of every layer and position, without the heads `off` names.
async function predict(model, text, off = []) {
  const options = {
    skipTokenEmbeddings: true,
    returnTokens: true,
    truncation: "TRUNCATION_RIGHT",
    predictions: { positions: [-1], topK: 10, logits: true },
  };
  options.logitLens = { topK: 5 };
  if (off.length) options.headMask = headMask(off);
  const result = (await post("/v1/encode", { model, inputs: [{ text }], options })).results[0];
  return { result, ...distribution(result.predictions) };
}

// The next-token distribution of predictions with logits after one position: every
// token's probability (the logits softmaxed here), the top ids and their texts.
function distribution(predictions) {
  const logits = decodeNumbers(predictions.logits);
  let peak = -Infinity;
  for (const v of logits) peak = Math.max(peak, v);
  const probabilities = Float64Array.from(logits, (v) => Math.exp(v - peak));
  const total = probabilities.reduce((a, b) => a + b, 0);
  for (let i = 0; i < probabilities.length; i++) probabilities[i] /= total;
  const top = Array.from(decodeNumbers(predictions.topIds));
  return { probabilities, top, names: new Map(top.map((id, k) => [id, predictions.topTokens[k]])) };
}

function drawLens(result) {
  const lens = result.logitLens;
  const k = Number(lens.topIds.shape[2]);
  const ids = decodeNumbers(lens.topIds), probabilities = decodeNumbers(lens.topProbabilities);
  const table = $("lens");
  table.innerHTML = "";
  const header = table.insertRow();
  header.appendChild(document.createElement("th")).textContent = "state";
  for (const p of lens.positions) header.appendChild(document.createElement("th")).textContent = result.tokens[p];
  lens.layers.forEach((layer, s) => {
    const tr = table.insertRow();
    tr.appendChild(document.createElement("th")).textContent = layer;
    lens.positions.forEach((position, p) => {
      const first = (s * lens.positions.length + p) * k;
      const td = tr.insertCell();
      td.textContent = lens.topTokens[first];
      td.style.background = colour(probabilities[first]);
      td.style.color = probabilities[first] > 0.5 ? "#fff" : "#1d1d1f";  // readable on dark
      Object.assign(td.dataset, { layer, position, id: ids[first], probability: probabilities[first] });
      const top = [...Array(k).keys()].map((j) =>
        `${JSON.stringify(lens.topTokens[first + j])} ${probabilities[first + j].toFixed(3)}`);
      td.onmouseenter = () => {
        $("lens-info").textContent =
          `state ${layer}, after ${position} ${JSON.stringify(result.tokens[position])}: ${top.join(", ")}`;
        $("lens-info").dataset.top = JSON.stringify(Array.from(ids.slice(first, first + k)));
      };
    });
  });
}

function drawSwitches(layers, heads) {
  const table = $("switches");
  table.innerHTML = "";
  for (let l = 0; l < layers; l++) {
    const tr = table.insertRow();
    tr.appendChild(document.createElement("th")).textContent = l;
    for (let h = 0; h < heads; h++) {
      const td = tr.insertCell();
      td.textContent = h;
      td.title = `layer ${l}, head ${h}: click to switch it off or on`;
      Object.assign(td.dataset, { layer: l, head: h });
      td.classList.toggle("off", state.off.has(`${l}.${h}`));
      td.onclick = () => {
        const key = `${l}.${h}`;
        if (!state.off.delete(key)) state.off.add(key);
        td.classList.toggle("off", state.off.has(key));
        saveUrl();
        show();  // every view again, without the heads now off
      };
    }
  }
}

// The next-token distribution with the switched-off heads removed, beside the model's own.
function drawAblation(before, after, off) {
  const table = $("ablation");
  drawBeforeAfter(table, before, after, before, "after");
  table.dataset.off = JSON.stringify(off);
  table.dataset.ready = "true";
}

// Two next-token distributions side by side, the union of their top tokens sorted by
// `order`'s probability: each row's token, both probabilities and the change.
function drawBeforeAfter(table, before, after, order, afterName) {
  const names = new Map([...before.names, ...after.names]);
  const ids = [...new Set([...before.top, ...after.top])].sort((i, j) => order.probabilities[j] - order.probabilities[i]);
  table.innerHTML = `<tr><th>next token</th><th>before</th><th>${afterName}</th><th>change</th></tr>`;
  for (const id of ids) {
    const tr = table.insertRow();
    const [b, a] = [before.probabilities[id], after.probabilities[id]];
    for (const text of [JSON.stringify(names.get(id)), b.toFixed(4), a.toFixed(4), (a - b >= 0 ? "+" : "") + (a - b).toFixed(4)])
      tr.insertCell().textContent = text;
    Object.assign(tr.dataset, { id, before: b, after: a });
  }
}

// A token by its text, which the model's tokenizer must make one token: its id and how the
// tokenizer shows it; an Error naming the pieces if not one.
async function oneToken(model, text) {
  const pieces = (await post("/v1/encode", {
    model, inputs: [{ text }], options: { skipTokenEmbeddings: true, returnTokens: true },
  })).results[0];
  let ids = pieces.tokenIds.map(Number), tokens = pieces.tokens;
  if (ids.length && ids[0] === state.bosId) { ids = ids.slice(1); tokens = tokens.slice(1); }
  if (ids.length !== 1)
    throw new Error(`${JSON.stringify(text)} is ${ids.length} tokens (${tokens.map((t) => JSON.stringify(t)).join(", ")}), not one`);
  return { id: ids[0], token: tokens[0] };
}

// The token to follow (its text, which the model's tokenizer must make one token): its
// probability after the last position and its rank among the vocabulary at every state.
async function followTarget(model, text, off) {
  const table = $("lens-target");
  table.innerHTML = "";
  delete table.dataset.ready;
  const wanted = $("target").value;
  $("target-note").textContent = "";
  if (!wanted) return;
  let id, token;
  try {
    ({ id, token } = await oneToken(model, wanted));
  } catch (error) {
    $("target-note").textContent = error.message;
    return;
  }
  const options = {
    skipTokenEmbeddings: true,
    truncation: "TRUNCATION_RIGHT",
    logitLens: { positions: [-1], topK: 1, logits: true, targetIds: [id] },
  };
  if (off.length) options.headMask = headMask(off);
  const lens = (await post("/v1/encode", { model, inputs: [{ text }], options })).results[0].logitLens;
  const logits = decodeNumbers(lens.logits);
  const v = logits.length / lens.layers.length;
  table.innerHTML = `<tr><th>state</th><th>p(${JSON.stringify(token)})</th><th>rank</th></tr>`;
  lens.layers.forEach((layer, s) => {
    const row = logits.subarray(s * v, (s + 1) * v);
    let peak = -Infinity;
    for (const x of row) peak = Math.max(peak, x);
    let total = 0;
    for (const x of row) total += Math.exp(x - peak);
    const mine = row[id];
    let rank = 1;
    for (const x of row) if (x > mine) rank += 1;
    const probability = Math.exp(mine - peak) / total;
    const tr = table.insertRow();
    for (const cell of [layer, probability.toFixed(4), rank]) tr.insertCell().textContent = cell;
    Object.assign(tr.dataset, { layer, probability, rank });
  });
  table.dataset.id = String(id);
  table.dataset.ready = "true";
}

async function showLens(model, text) {
  $("ablation").dataset.ready = "false";
  const off = offList();
  let shown;
  try {
    const key = JSON.stringify([model, text]);  // the model's own, asked once per text
    if (state.predictionsKey !== key) {
      state.predictions = await predict(model, text);
      state.predictionsKey = key;
    }
    shown = off.length ? await predict(model, text, off) : state.predictions;
  } catch (error) {  // e.g. a model exported before the readouts: said, attention still shown
    $("lens-section").hidden = true;
    $("patching-section").hidden = true;
    $("lens-note").hidden = false;
    $("lens-note").textContent = `No logit lens for ${model}: ${error.message}`;
    return;
  }
  $("lens-note").hidden = true;
  $("lens-section").hidden = false;
  $("patching-section").hidden = false;
  const layers = state.predictions.result.logitLens.layers.length - 1;
  // a middle layer: the first ones hold little more than the tokens themselves
  fillSelect("steer-layer", layers, $("steer-layer").value || Math.floor(layers / 2));
  drawLens(shown.result);
  drawSwitches(state.predictions.result.logitLens.layers.length - 1, state.panes.a.packed.shape[1]);
  drawAblation(state.predictions, shown, off);
  try {
    await followTarget(model, text, off);
  } catch (error) {
    $("target-note").textContent = error.message;
  }
}

// ---- interventions: activation patching, and steering ----

// Each token's input-times-gradient saliency of the patching metric (the attribution
// method's): red where the token pushes the answer over the other, blue where against it.
function drawSaliency(values, tokens) {
  const table = $("saliency");
  table.innerHTML = "";
  const head = table.insertRow(), row = table.insertRow();
  head.insertCell().textContent = "";
  row.appendChild(document.createElement("th")).textContent = "saliency";
  const largest = Math.max(...values.map(Math.abs), 1e-12);
  tokens.forEach((token, t) => {
    head.appendChild(document.createElement("th")).textContent = token;
    const td = row.insertCell(), share = values[t] / largest;
    td.textContent = values[t].toFixed(2);
    td.style.background = share >= 0 ? `rgba(200, 40, 40, ${share})` : `rgba(40, 80, 200, ${-share})`;
    td.title = `${token}: input x gradient ${values[t].toFixed(4)}`;
    Object.assign(td.dataset, { position: t, value: values[t] });
  });
  table.hidden = false;
}


// The patching grid of the text against the clean text: one request; each cell coloured by
// the share of the clean difference it brings back, (value - corrupted) / (clean - corrupted).
async function showPatching(event) {
  if (event) event.preventDefault();
  const table = $("patching");
  table.dataset.ready = "false";
  $("patch-note").textContent = "";
  const model = $("model-a").value, text = $("patch-corrupted").value, hook = $("patch-hook").value;
  const method = $("patch-method").value;
  $("saliency").hidden = true;
  try {
    const options = {
      skipTokenEmbeddings: true,
      returnTokens: true,
      patching: {
        source: { text: $("patch-clean").value },
        hook,
        targetId: (await oneToken(model, $("patch-answer").value)).id,
        contrastId: (await oneToken(model, $("patch-contrast").value)).id,
        method,
      },
    };
    const result = (await post("/v1/encode", { model, inputs: [{ text }], options })).results[0];
    const grid = result.patching, values = decodeNumbers(grid.values);
    const [layers, columns] = grid.values.shape.map(Number);
    const clean = grid.clean || 0, corrupted = grid.corrupted || 0;
    const labels = hook === "z" ? Array.from({ length: columns }, (_, h) => `H${headLabel(h)}`) : result.tokens;
    table.innerHTML = "";
    const head = table.insertRow();
    head.insertCell().textContent = "";
    for (const label of labels) head.appendChild(document.createElement("th")).textContent = label;
    for (let layer = 0; layer < layers; layer++) {
      const tr = table.insertRow();
      tr.appendChild(document.createElement("th")).textContent = `L${layer}`;
      for (let c = 0; c < columns; c++) {
        const value = values[layer * columns + c];
        const recovered = clean === corrupted ? 0 : (value - corrupted) / (clean - corrupted);
        const td = tr.insertCell();
        td.textContent = recovered.toFixed(2);
        td.style.background = colour(Math.max(0, Math.min(1, recovered)));
        td.style.color = recovered > 0.6 ? "white" : "black";
        td.title = `${labels[c]} at layer ${layer}: logit difference ${value.toFixed(4)} (clean ${clean.toFixed(4)}, corrupted ${corrupted.toFixed(4)})`;
        Object.assign(td.dataset, { layer, column: c, value, recovered });
      }
    }
    if (grid.saliency) drawSaliency(decodeNumbers(grid.saliency), result.tokens);
    Object.assign(table.dataset, { hook, method, clean, corrupted, warning: grid.warning || "", ready: "true" });
    $("patch-note").textContent = `logit difference clean ${clean.toFixed(3)}, corrupted ${corrupted.toFixed(3)}`
      + (grid.warning ? `. Warning: ${grid.warning}` : "");
  } catch (error) {
    $("patch-note").textContent = error.message;
  }
}

// The next-token distribution after the text's last token, with `interventions` applied.
async function nextTokens(model, text, interventions) {
  const options = {
    skipTokenEmbeddings: true,
    truncation: "TRUNCATION_RIGHT",
    predictions: { positions: [-1], topK: 10, logits: true },
    interventions,
  };
  return distribution((await post("/v1/encode", { model, inputs: [{ text }], options })).results[0].predictions);
}

function base64Floats(values) {  // float32 little-endian, as a Tensor's data
  const bytes = new Uint8Array(Float32Array.from(values).buffer);
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text);
}

// Activation addition: the two texts' residual streams at `hook`, captured and averaged
// over their tokens; their difference times the strength, as an intervention at every token.
async function textsDirection(model, hook, strength) {
  const captured = await Promise.all([$("steer-plus").value, $("steer-minus").value].map(async (t) => {
    const options = { skipTokenEmbeddings: true, capture: { hooks: [hook] } };
    const result = (await post("/v1/encode", { model, inputs: [{ text: t }], options })).results[0];
    const values = decodeNumbers(result.activations[hook]);
    const width = Number(result.activations[hook].shape[1]), rows = values.length / width;
    const mean = new Array(width).fill(0);
    for (let i = 0; i < values.length; i++) mean[i % width] += values[i] / rows;
    return mean;
  }));
  const direction = captured[0].map((v, i) => v - captured[1][i]);
  const values = { shape: [direction.length], dtype: "DTYPE_FLOAT32", data: base64Floats(direction) };
  return [
    { hook, op: "INTERVENTION_OP_ADD", values, scale: strength },  // /v1/encode's
    { hook, op: "add", values: Array.from(direction), scale: strength },  // /v1/completions'
  ];
}

// The text continued with `steer` (/v1/completions' interventions) and without, side by
// side, each filled in as its tokens stream in (compare: choice 0 steered, 1 plain).
async function showContinuations(model, text, steer, tokens) {
  const box = $("continuations"), shown = [$("steered-text"), $("plain-text")];
  box.dataset.ready = "false";
  box.hidden = tokens <= 0;
  shown.forEach((pre) => { pre.textContent = ""; });
  if (tokens <= 0) return;
  const body = { model, prompt: text, max_tokens: tokens, temperature: 0, stream: true,
                 interventions: [steer], compare: true };
  const response = await fetch("/v1/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error((await response.json()).error.message);
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    const events = pending.split("\n\n");
    pending = events.pop();
    for (const event of events) {
      if (!event.startsWith("data: {")) continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices) appendMarked(shown[choice.index], choice.text);
    }
  }
  box.dataset.ready = "true";
}

// Whitespace marks for generated text, as the lens shows tokens: each space, tab and line
// end drawn with a mark over it (CSS ::before), the text itself (textContent) unchanged.
const MARKS = { " ": "\u2423", "\t": "\u21e5", "\n": "\u21b5" };
function appendMarked(pre, text) {
  for (const part of text.split(/([ \t\n])/)) {
    if (!part) continue;
    if (!(part in MARKS)) {
      pre.append(part);
      continue;
    }
    const span = document.createElement("span");
    span.className = "ws";
    span.dataset.mark = MARKS[part];
    span.textContent = part;
    pre.append(span);
  }
}

// The steering box: a direction (two texts' difference, or an SAE feature's decoder row at
// the SAE's site) times a strength added at every token; the next token before and after.
async function showSteering(event) {
  if (event) event.preventDefault();
  const table = $("steering");
  table.dataset.ready = "false";
  $("steer-note").textContent = "";
  const model = $("model-a").value, text = $("text").value;
  const layer = Number($("steer-layer").value), strength = Number($("steer-strength").value);
  const byFeature = $("steer-kind").value === "feature";
  try {
    const feature = { sae: $("steer-sae").value, id: Number($("steer-feature-id").value) };
    const [steer, continued] = byFeature
      ? [{ op: "INTERVENTION_OP_ADD", feature: { sae: feature.sae, featureId: feature.id }, scale: strength },
         { op: "add", feature: { sae: feature.sae, feature_id: feature.id }, scale: strength }]
      : await textsDirection(model, `blocks.${layer}.hook_resid_pre`, strength);
    const [before, after] = await Promise.all([nextTokens(model, text, []), nextTokens(model, text, [steer])]);
    drawBeforeAfter(table, before, after, after, "steered");
    Object.assign(table.dataset, { kind: $("steer-kind").value, layer, strength, ready: "true" });
    await showContinuations(model, text, continued, Number($("steer-tokens").value));
  } catch (error) {
    $("steer-note").textContent = error.message;
  }
}

// ---- sparse-autoencoder features: each token's strongest, and one feature everywhere ----

function fillSaes() {
  const select = $("sae"), keep = new URLSearchParams(location.search).get("sae") || select.value;
  select.innerHTML = "";
  $("steer-sae").innerHTML = "";
  // SAEs first, then transcoders (read at one site, written at another: hookNameOut)
  const ordered = [...state.saes].sort((a, b) => !!a.hookNameOut - !!b.hookNameOut);
  for (const sae of ordered) {
    select.add(new Option(sae.name, sae.name));
    $("steer-sae").add(new Option(sae.name, sae.name));
  }
  if (state.saes.some((sae) => sae.name === keep)) select.value = keep;
  $("steer-kind").options[1].disabled = !state.saes.length;  // steering by a feature needs one
}

// The chosen SAE's top five features at every token, without the heads `off` names.
async function showFeatures(model, text, off) {
  const section = $("features-section");
  section.hidden = !state.saes.length;
  if (!state.saes.length) return;
  section.dataset.ready = "false";
  const sae = $("sae").value;
  const info = state.saes.find((s) => s.name === sae);
  $("sae-info").textContent = `${info.architecture}, ${info.dSae} features on ${info.hookName}`;
  const options = {
    skipTokenEmbeddings: true,
    returnTokens: true,
    truncation: "TRUNCATION_RIGHT",
    features: { saes: [sae], topK: 5 },
  };
  if (off.length) options.headMask = headMask(off);
  const result = (await post("/v1/encode", { model, inputs: [{ text }], options })).results[0];
  const f = result.features;
  const k = Number(f.topIds.shape[2]);
  const ids = decodeNumbers(f.topIds), acts = decodeNumbers(f.topActivations);
  state.features = { model, text, off, sae, tokens: result.tokens };
  let peak = 0;
  for (const a of acts) peak = Math.max(peak, a);
  const box = $("feature-tokens");
  box.innerHTML = "";
  result.tokens.forEach((token, position) => {
    const column = document.createElement("div");
    column.className = "feature-token";
    column.dataset.position = position;
    column.appendChild(document.createElement("b")).textContent = token;
    for (let j = 0; j < k; j++) {
      const id = ids[position * k + j], a = acts[position * k + j];
      if (id < 0) break;  // fewer than five active
      const row = column.appendChild(document.createElement("div"));
      row.className = "feature";
      Object.assign(row.dataset, { id, activation: a });
      row.textContent = `#${id} ${a.toFixed(2)}`;
      row.appendChild(document.createElement("span")).style.width = `${(100 * a) / (peak || 1)}%`;
      row.addEventListener("click", () => traceFeature(id));
    }
    box.appendChild(column);
  });
  if (state.traced !== null && state.traced < info.dSae) await traceFeature(state.traced);
  else {
    $("feature-trace").innerHTML = "";
    $("trace-caption").hidden = true;
  }
  section.dataset.ready = "true";
}

// One feature's activation at every token of the text, as bars.
async function traceFeature(id) {
  const { model, text, off, sae, tokens } = state.features;
  const trace = $("feature-trace");
  trace.dataset.ready = "false";
  const options = {
    skipTokenEmbeddings: true,
    truncation: "TRUNCATION_RIGHT",
    features: { saes: [sae], topK: 1, featureIds: [id] },
  };
  if (off.length) options.headMask = headMask(off);
  const result = (await post("/v1/encode", { model, inputs: [{ text }], options })).results[0];
  const values = decodeNumbers(result.features.featureActivations);
  let peak = 0;
  for (const v of values) peak = Math.max(peak, v);
  trace.innerHTML = "";
  tokens.forEach((token, position) => {
    const cell = trace.appendChild(document.createElement("div"));
    cell.className = "trace-token";
    Object.assign(cell.dataset, { position, activation: values[position] });
    cell.title = `${token}: ${values[position].toFixed(3)}`;
    cell.appendChild(document.createElement("div")).style.height = `${(60 * values[position]) / (peak || 1)}px`;
    cell.appendChild(document.createElement("span")).textContent = token;
  });
  for (const row of document.querySelectorAll("#feature-tokens .feature"))
    row.classList.toggle("chosen", Number(row.dataset.id) === id);
  $("trace-caption").hidden = false;
  $("trace-caption").textContent = `feature #${id} of ${sae} at every token (largest ${peak.toFixed(3)})`;
  trace.dataset.feature = id;
  trace.dataset.ready = "true";
  state.traced = id;
  saveUrl();
}

function headLabel(h) {
  return state.kvHeads ? `${h} (kv ${state.kvHeads[h]})` : String(h);
}

async function show(event) {
  if (event) {  // the Show button: everything asked afresh (a reload may have changed the model)
    event.preventDefault();
    state.predictionsKey = null;
  }
  const text = $("text").value;
  if (!text) return;
  $("status").className = "";
  $("status").textContent = "encoding...";
  showLongMode();
  try {
    if (longMode()) return await showLong($("model-a").value, text);
    const how = $("compare").value;
    const second = how === "model" ? [$("model-b").value, text]
      : how === "text" ? [$("model-a").value, $("text-b").value] : null;
    const off = offList();  // the other text goes through the same model, the same heads off
    const [first, other] = await Promise.all([
      encode($("model-a").value, text, off),
      second && second[1] ? encode(...second, how === "text" ? off : []) : null,
    ]);
    const result = first.result;
    state.panes = { a: first.encoding, b: other ? other.encoding : null };
    const shapes = [first, other].filter(Boolean).map((e) => e.encoding.packed.shape);
    const params = new URLSearchParams(location.search);
    fillSelect("layer", Math.max(...shapes.map((s) => s[0])), params.get("layer"));
    fillSelect("head", Math.max(...shapes.map((s) => s[1])), params.get("head"));
    drawEntropy();
    update();
    const cut = result.truncated ? " (truncated to the model's max_seq_len)" : "";
    $("status").textContent = `${result.tokens.length} tokens${cut}, server ${first.ms.toFixed(1)} ms`;
    await showLens(first.encoding.model, first.encoding.text);
    await showFeatures(first.encoding.model, first.encoding.text, off);
  } catch (error) {
    if (error instanceof Unauthorized) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken(had ? "That token was refused; enter the server's token." : "This server needs its bearer token.");
      return;
    }
    $("status").className = "error";
    $("status").textContent = `error: ${error.message}`;
  }
}

// ---- long texts: statistics by query blocks and tiles, never the T x T map ----

const TOP_K = 8;
const TILE = 128;  // a zoomed tile's rows and keys
// A long text's first request runs its whole forward pass: minutes at 8,192 tokens on a
// CPU (about 3 for a 1B model here), past the server's default HTTP deadline of a minute.
const LONG_DEADLINE_S = 900;

function longMode() {
  return $("view").value === "long";
}

function sameHead() {
  return state.long.layer === Number($("layer").value) && state.long.head === Number($("head").value);
}

// The long view's elements, or the maps', as the view says.
function showLongMode() {
  const long = longMode();
  $("long").hidden = !long;
  $("maps").hidden = long;
  $("heads-strip").hidden = long;
  if (long) $("scale").hidden = true;
  else state.long = null;
}

// One head's statistics of the whole text: each row's top keys, each key's received
// attention and each row's entropy (one request; the server keeps the text's queries and
// keys for the tiles asked next).
async function showLong(model, text) {
  const layer = Number($("layer").value) || 0, head = Number($("head").value) || 0;
  const options = {
    skipTokenEmbeddings: true, returnTokens: true, truncation: "TRUNCATION_RIGHT",
    attention: { layers: [layer], heads: [head], topK: TOP_K, received: true, rowEntropy: true },
  };
  const answer = await post("/v1/encode", { model, inputs: [{ text }], options }, LONG_DEADLINE_S);
  const r = answer.results[0];
  const cut = $("long-cut");
  cut.hidden = !r.truncated;  // the model's context ends the text: say where
  cut.textContent = r.truncated
    ? `The text is longer than the model's context: only its first ${r.tokens.length} tokens are shown (max_seq_len); it ended after "${r.tokens.slice(-8).join("")}".`
    : "";
  state.long = {
    model, text, layer, head, tokens: r.tokens,
    values: decodeNumbers(r.attention), indices: decodeNumbers(r.attentionIndices),
    received: decodeNumbers(r.attentionReceived), entropy: decodeNumbers(r.attentionRowEntropy),
  };
  state.panes = { a: null, b: null };
  const ms = Number(answer.timings.totalNs) / 1e6;
  $("status").textContent = `${r.tokens.length} tokens, layer ${layer} head ${head}, server ${ms.toFixed(1)} ms`;
  drawReceived();
  drawOverview();
  await zoom(Math.max(0, r.tokens.length - TILE), 0);
}

function drawReceived() {
  const { tokens, received } = state.long;
  const peak = Math.max(1e-9, ...received.slice(1));
  const box = $("long-tokens");
  box.innerHTML = "";
  tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.textContent = token;
    span.style.background = colour(received[i] / peak);
    span.dataset.position = String(i);
    span.dataset.received = String(received[i]);
    span.title = `token ${i}: receives ${received[i].toFixed(3)}`;
    span.addEventListener("mouseenter", () => showTopKeys(i));
    box.append(span);
  });
  box.dataset.ready = "true";
}

// Row i's top keys, listed and outlined in the text.
function showTopKeys(row) {
  const { tokens, values, indices, entropy } = state.long;
  const keys = [];
  for (let k = 0; k < TOP_K; k++) {
    const j = indices[row * TOP_K + k];
    if (j >= 0) keys.push([j, values[row * TOP_K + k]]);
  }
  for (const span of $("long-tokens").querySelectorAll("span.key")) span.classList.remove("key");
  const spans = $("long-tokens").children;
  for (const [j] of keys) spans[j].classList.add("key");
  const info = $("long-top");
  info.textContent = `token ${row} ${JSON.stringify(tokens[row])} (entropy ${entropy[row].toFixed(3)} nats) attends most to: ` +
    keys.map(([j, v]) => `${j} ${JSON.stringify(tokens[j])} ${v.toFixed(3)}`).join(", ");
  info.dataset.row = String(row);
  info.dataset.keys = keys.map(([j]) => j).join(",");
}

// The whole map as each row's top keys: exact where drawn, blank elsewhere.
function drawOverview() {
  const { tokens, values, indices } = state.long;
  const t = tokens.length, canvas = $("long-overview"), size = canvas.width;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(size, size);
  const peak = new Float32Array(size * size);
  for (let i = 0; i < t; i++) {
    for (let k = 0; k < TOP_K; k++) {
      const j = indices[i * TOP_K + k];
      if (j < 0) continue;
      const cell = Math.floor(i * size / t) * size + Math.floor(j * size / t);
      peak[cell] = Math.max(peak[cell], values[i * TOP_K + k]);
    }
  }
  for (let c = 0; c < peak.length; c++) {
    const x = Math.min(1, peak[c]);
    image.data.set([255 - 215 * x, 255 - 170 * x, 255 - 60 * x, 255], 4 * c);
  }
  ctx.putImageData(image, 0, 0);
}

// Rows r0.. and keys k0.. of the head, TILE of each (fewer at the text's end), exactly.
async function zoom(r0, k0) {
  const { model, text, layer, head, tokens } = state.long;
  const t = tokens.length, n = Math.min(TILE, t);
  r0 = Math.max(0, Math.min(r0, t - n));
  k0 = Math.max(0, Math.min(k0, t - n));
  const rows = Array.from({ length: n }, (_, i) => r0 + i);
  const options = {
    skipTokenEmbeddings: true, truncation: "TRUNCATION_RIGHT",
    attention: { layers: [layer], heads: [head], queryPositions: rows, keyStart: k0, keyEnd: k0 + n },
  };
  const answer = await post("/v1/encode", { model, inputs: [{ text }], options }, LONG_DEADLINE_S);
  const weights = decodeNumbers(answer.results[0].attention);  // (1, 1, n, n)
  const canvas = $("long-tile"), cell = canvas.width / n, ctx = canvas.getContext("2d");
  const peak = Math.max(1e-9, ...weights);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    ctx.fillStyle = colour(weights[i * n + j] / peak);
    ctx.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
  }
  state.tile = { r0, k0, n, cell, weights };
  $("long-tile-caption").textContent = `rows ${r0}..${r0 + n - 1}, keys ${k0}..${k0 + n - 1} (colours to the tile's largest, ${peak.toFixed(3)})`;
  Object.assign(canvas.dataset, { r0: String(r0), k0: String(k0), ready: "true" });
}

function hoverTile(event) {
  const tile = state.tile;
  if (!tile) return;
  const rect = event.target.getBoundingClientRect();
  const i = Math.floor((event.clientY - rect.top) / tile.cell), j = Math.floor((event.clientX - rect.left) / tile.cell);
  if (i < 0 || j < 0 || i >= tile.n || j >= tile.n) return;
  const row = tile.r0 + i, key = tile.k0 + j, w = tile.weights[i * tile.n + j];
  const { tokens } = state.long;
  const info = $("long-tile-info");
  info.textContent = `query ${row} ${JSON.stringify(tokens[row])} -> key ${key} ${JSON.stringify(tokens[key])}: ${w.toFixed(4)}`;
  Object.assign(info.dataset, { row: String(row), key: String(key), value: String(w) });
}

function zoomAt(event) {
  const rect = event.target.getBoundingClientRect(), t = state.long.tokens.length;
  const row = Math.floor((event.clientY - rect.top) / rect.height * t);
  const key = Math.floor((event.clientX - rect.left) / rect.width * t);
  $("long-tile").dataset.ready = "false";
  zoom(row - TILE / 2, key - TILE / 2).catch((error) => { $("long-tile-info").textContent = error.message; });
}

async function init() {
  const params = new URLSearchParams(location.search);
  for (const [id, name] of Object.entries(URL_PARAMS))
    if (params.get(name) && !["layer", "head", "model-a", "model-b", "sae"].includes(id)) $(id).value = params.get(name);
  if (/^\d+$/.test(params.get("feature") || "")) state.traced = Number(params.get("feature"));
  for (const key of (params.get("off") || "").split(",")) if (/^\d+\.\d+$/.test(key)) state.off.add(key);
  showCompareInputs();
  fillSelect("layer", 1, 0);
  fillSelect("head", 1, 0);
  $("controls").addEventListener("submit", show);
  for (const id of ["layer", "head", "view", "rows"]) $(id).addEventListener("change", update);
  $("compare").addEventListener("change", () => { showCompareInputs(); show(); });
  $("model-a").addEventListener("change", async () => {
    state.off.clear();  // another model's heads
    await loadModelInfo();
    await show();
  });
  $("model-b").addEventListener("change", () => show());
  for (const [id, which] of [["heatmap", "a"], ["heatmap-b", "b"], ["heatmap-diff", "diff"]]) {
    $(id).addEventListener("mousemove", (event) => hover(event, which));
    $(id).addEventListener("mouseleave", () => draw());
  }
  $("long-overview").addEventListener("click", zoomAt);
  $("long-tile").addEventListener("mousemove", hoverTile);
  $("auth").addEventListener("submit", useToken);
  $("patch-form").addEventListener("submit", showPatching);
  $("steer-form").addEventListener("submit", showSteering);
  $("steer-kind").addEventListener("change", () => {
    $("steer-texts").hidden = $("steer-kind").value === "feature";
    $("steer-feature").hidden = $("steer-kind").value !== "feature";
  });
  $("sae").addEventListener("change", () => {
    state.traced = null;  // another SAE's features
    saveUrl();
    const { model, text, off } = state.features || {};
    if (model) showFeatures(model, text, off).catch((error) => { $("sae-info").textContent = error.message; });
  });
  $("target-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    saveUrl();
    try { await followTarget(state.panes.a.model, state.panes.a.text, offList()); }
    catch (error) { $("target-note").textContent = error.message; }
  });
  if (!(await loadModels())) return askForToken("This server needs its bearer token.");
  await loadModelInfo();
  if (params.get("text")) await show();
}

init();
