// The explorer's attribution graph: circuit-tracer's graph of the text (POST /v1/graph,
// streamed for its progress), drawn with the tokens across and the layers up. Uses
// explorer.js's $, authHeaders and state; loadModelInfo calls fillTranscoderSets.
"use strict";

const GRAPH_DEADLINE_S = 900;
const GRAPH_TOP_LOGITS = 5;
const COLUMN = 96, ROW = 56, MARGIN = 28;  // px per token (at least), per layer
const SPACING = 16;  // px between the centres of nodes sharing a cell

function fillTranscoderSets(sets) {
  const select = $("graph-set");
  const keep = select.value;
  select.innerHTML = "";
  for (const name of sets) select.add(new Option(name, name));
  if (sets.includes(keep)) select.value = keep;
  $("graph-section").hidden = !sets.length;
}

// circuit-tracer's graph of the text: the answer, after a line of progress per backward pass.
async function fetchGraph(body, onProgress) {
  const response = await fetch("/v1/graph", {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      "Request-Timeout": String(GRAPH_DEADLINE_S),
      ...authHeaders(),
    },
    body: JSON.stringify({ ...body, stream: true }),
  });
  if (!response.ok) {
    const json = await response.json();
    throw new Error(json.error ? json.error.message : response.statusText);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += value;
    let end;
    while ((end = buffered.indexOf("\n")) >= 0) {
      const line = JSON.parse(buffered.slice(0, end));
      buffered = buffered.slice(end + 1);
      if (line.error) throw new Error(line.error.message);
      if (line.progress) onProgress(line.progress);
      else return line;
    }
  }
  throw new Error("the server ended the graph without an answer");
}

// A node's row: the embeddings at the bottom, then the layers, the logits on top (a logit's
// layer is the model's depth, L).
function graphRow(node) {
  if (node.feature_type === "embedding") return 0;
  return Number(node.layer) + (node.feature_type === "logit" ? 0 : 1);
}

function svgElement(name, attributes) {
  const element = document.createElementNS($("graph").namespaceURI, name);  // SVG's
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

function drawGraph(graph) {
  const svg = $("graph");
  svg.innerHTML = "";
  const nodes = graph.nodes;
  const tokens = graph.metadata.prompt_tokens;
  const top = Math.max(...nodes.filter((n) => n.feature_type === "logit").map(graphRow));
  // nodes sharing a (row, token) cell sit side by side in it
  const cells = new Map();
  for (const node of nodes) {
    const key = `${graphRow(node)}/${node.ctx_idx}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(node);
  }
  // a token's column widens to fit its most crowded cell: no node covers another
  const widths = tokens.map(() => COLUMN);
  for (const [key, group] of cells) {
    const position = Number(key.split("/")[1]);
    widths[position] = Math.max(widths[position], SPACING * (group.length + 1));
  }
  const starts = widths.map((_, i) => MARGIN + widths.slice(0, i).reduce((a, b) => a + b, 0));
  const place = new Map();  // node_id -> [x, y]; ids can collide (circuit-tracer's): the last wins
  for (const [key, group] of cells) {
    const [row, position] = key.split("/").map(Number);
    group.forEach((node, i) => {
      const x = starts[position] + ((i + 1) * widths[position]) / (group.length + 1);
      const y = MARGIN + (top - row) * ROW + ROW / 2;
      place.set(node.node_id, [x, y]);
      node.xy = [x, y];
    });
  }
  const width = MARGIN + starts[tokens.length - 1] + widths[tokens.length - 1];
  const height = 2 * MARGIN + (top + 1) * ROW;
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const peak = Math.max(1e-12, ...graph.links.map((l) => Math.abs(l.weight)));
  const lines = svg.appendChild(svgElement("g", { class: "links" }));
  for (const link of graph.links) {
    const [a, b] = [place.get(link.source), place.get(link.target)];
    if (!a || !b) continue;
    const line = svgElement("line", {
      x1: a[0], y1: a[1], x2: b[0], y2: b[1],
      "stroke-width": (0.4 + (3.6 * Math.abs(link.weight)) / peak).toFixed(2),
      stroke: link.weight >= 0 ? "#2166ac" : "#b2182b",
    });
    Object.assign(line.dataset, { source: link.source, target: link.target, weight: link.weight });
    lines.appendChild(line);
  }
  const marks = svg.appendChild(svgElement("g", { class: "nodes" }));
  for (const node of nodes) {
    const [x, y] = node.xy;
    const kind = node.feature_type;
    const mark = kind === "cross layer transcoder" ? svgElement("circle", { cx: x, cy: y, r: 6 })
      : kind === "mlp reconstruction error" ? svgElement("rect", { x: x - 5, y: y - 5, width: 10, height: 10 })
      : svgElement("text", { x, y: y + 4, "text-anchor": "middle" });
    if (kind === "embedding") mark.textContent = tokens[node.ctx_idx];
    if (kind === "logit") mark.textContent = node.clerp.replace(/^Output "(.*)" \(p=.*$/s, "$1");
    mark.setAttribute("class", kind.replace(/ /g, "-"));
    Object.assign(mark.dataset, { id: node.node_id, js: node.jsNodeId, kind });
    mark.addEventListener("mouseenter", () => hoverNode(graph, node, mark));
    marks.appendChild(mark);
  }
}

// What the hovered node is, and its links lit.
function hoverNode(graph, node, mark) {
  for (const line of $("graph").querySelectorAll("line")) {
    const touches = line.dataset.source === node.node_id || line.dataset.target === node.node_id;
    line.classList.toggle("lit", touches);
  }
  for (const other of $("graph").querySelectorAll(".hovered")) other.classList.remove("hovered");
  mark.classList.add("hovered");
  const token = JSON.stringify(graph.metadata.prompt_tokens[node.ctx_idx]);
  const influence = node.influence === null ? "" : `, influence ${node.influence.toFixed(3)}`;
  let text;
  if (node.feature_type === "cross layer transcoder") {
    const [layer, feature] = node.jsNodeId.replace(/-0$/, "").split("_");
    const raises = (graph.feature_logits || {})[node.jsNodeId] || [];
    const listed = raises.map((t) => `${JSON.stringify(t.token)} ${t.logit.toFixed(2)}`).join(", ");
    text = `layer ${layer} feature ${feature} at ${token}: activation ${node.activation.toFixed(3)}${influence}` +
      (listed ? `; raises ${listed}` : "");
  } else if (node.feature_type === "mlp reconstruction error") {
    text = `layer ${node.layer}'s transcoder error at ${token}${influence}`;
  } else if (node.feature_type === "embedding") {
    text = `the embedding of ${token}${influence}`;
  } else {
    text = node.clerp;
  }
  $("graph-info").textContent = text;
  $("graph-info").dataset.node = node.node_id;
}

async function showGraph(event) {
  if (event) event.preventDefault();
  const section = $("graph-section");
  section.dataset.ready = "false";
  $("graph-note").textContent = "";
  const body = {
    model: $("model-a").value,
    prompt: $("text").value,
    transcoders: $("graph-set").value,
    max_feature_nodes: Number($("graph-nodes").value),
    node_threshold: Number($("graph-node-threshold").value),
    edge_threshold: Number($("graph-edge-threshold").value),
    top_logits: GRAPH_TOP_LOGITS,
  };
  const started = performance.now();
  try {
    const graph = await fetchGraph(body, ({ rows, total }) => {
      $("graph-progress").textContent = `backward rows ${rows} of ${total}`;
    });
    drawGraph(graph);
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const { replacement, completeness } = graph.scores;
    $("graph-progress").textContent = `${graph.nodes.length} nodes, ${graph.links.length} links in ${seconds} s; ` +
      `replacement score ${replacement.toFixed(3)}, completeness ${completeness.toFixed(3)}`;
    Object.assign(section.dataset, { ready: "true", nodes: graph.nodes.length, links: graph.links.length });
  } catch (error) {
    $("graph-note").textContent = error.message;
    section.dataset.ready = "error";
  }
}

function initGraph() {
  $("graph-form").addEventListener("submit", showGraph);
  for (const id of ["graph-node-threshold", "graph-edge-threshold"]) {
    const slider = $(id);
    const shown = () => { slider.nextElementSibling.textContent = Number(slider.value).toFixed(2); };
    slider.addEventListener("input", shown);
    slider.addEventListener("change", () => showGraph());  // pruned again by the server
    shown();
  }
}

initGraph();
