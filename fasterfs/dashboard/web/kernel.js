// The /kernel view: the heatmap drawn on one canvas from binary WebSocket frames
// (fasterfs/node/heatmap.py: 18-byte header, then per host a presence byte and one byte per
// chunk: state << 5 | count), and uPlot timelines from /api/timeline.
"use strict";

const ffs = window.ffs = {frames: 0, reconnects: 0, layout: null, frame: null, missing: {}, charts: [],
                          geometry: null, timeline: null};
const HEADER = 18, MAGIC = 0x48534646;  // "FFSH" little-endian
const grid = document.getElementById("grid"), tip = document.getElementById("tip");
const statusEl = document.getElementById("status");

function setStatus(text, cls) { statusEl.textContent = text; statusEl.className = cls || ""; }

function hex(c) { return [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)); }

async function loadLayout() {
  const r = await fetch("api/kernel/layout");
  if (!r.ok) throw new Error("layout: HTTP " + r.status);
  const layout = await r.json();
  let offset = 0;
  layout.offsets = layout.datasets.map(d => { const o = offset; offset += d.keys.length; return o; });
  layout.cells = offset;
  layout.rgb = {};
  for (const [code, s] of Object.entries(layout.states)) layout.rgb[code] = hex(s.color);
  ffs.layout = layout;
  document.getElementById("legend").innerHTML = Object.values(layout.states)
    .map(s => `<span><i style="background:${s.color}"></i>${s.name}</span>`).join("");
  geometry();
}

// Hosts side by side (wrapping), each a block of cells; one ImageData for all of them.
function geometry() {
  const L = ffs.layout, n = Math.max(L.cells, 1), hosts = L.nodes.length;
  const width = Math.max(600, Math.min(window.innerWidth - 40, 1800));
  const perRow = Math.max(1, Math.min(hosts, Math.floor(width / 200)));
  const panelW = Math.floor(width / perRow) - 12;
  let cell = 14;
  while (cell > 1 && Math.ceil(n / Math.floor(panelW / cell)) * cell > 600) cell--;
  const cols = Math.max(1, Math.floor(panelW / cell)), rows = Math.ceil(n / cols);
  const labelH = 16, panelH = rows * cell + labelH + 8;
  grid.width = perRow * (panelW + 12);
  grid.height = Math.ceil(hosts / perRow) * panelH;
  ffs.geometry = {cell, cols, rows, panelW, panelH, perRow, labelH};
}

// Where cell i of host slot h is drawn (tests read the pixel there).
ffs.cellXY = function (h, i) {
  const g = ffs.geometry;
  const px = (h % g.perRow) * (g.panelW + 12), py = Math.floor(h / g.perRow) * g.panelH + g.labelH;
  return [px + (i % g.cols) * g.cell + Math.floor(g.cell / 2), py + Math.floor(i / g.cols) * g.cell + Math.floor(g.cell / 2)];
};

function draw() {
  const L = ffs.layout, f = ffs.frame, g = ffs.geometry;
  const ctx = grid.getContext("2d");
  ctx.fillStyle = "#0d1117";
  ctx.fillRect(0, 0, grid.width, grid.height);
  const img = ctx.createImageData(grid.width, grid.height), px = img.data;
  const gap = g.cell >= 4 ? 1 : 0, threshold = L.hot_threshold || 2;
  const dark = L.rgb[0], amber = L.rgb[1];
  for (let h = 0; h < f.nodes; h++) {
    const base = h * (1 + f.cells) + 1, present = f.body[base - 1] === 1;
    const ox = (h % g.perRow) * (g.panelW + 12), oy = Math.floor(h / g.perRow) * g.panelH + g.labelH;
    for (let i = 0; i < f.cells; i++) {
      const v = f.body[base + i], state = v >> 5, count = v & 31;
      let rgb;
      if (!present) rgb = [60, 60, 60];
      else if (state === 1) {  // counted: from dark towards amber with the count
        const t = Math.min(1, 0.35 + 0.65 * count / threshold);
        rgb = [0, 1, 2].map(k => Math.round(dark[k] + (amber[k] - dark[k]) * t));
      } else rgb = L.rgb[state] || [255, 0, 255];
      const x0 = ox + (i % g.cols) * g.cell, y0 = oy + Math.floor(i / g.cols) * g.cell;
      for (let y = y0; y < y0 + g.cell - gap; y++) {
        let o = (y * grid.width + x0) * 4;
        for (let x = 0; x < g.cell - gap; x++, o += 4) { px[o] = rgb[0]; px[o + 1] = rgb[1]; px[o + 2] = rgb[2]; px[o + 3] = 255; }
      }
    }
  }
  ctx.putImageData(img, 0, 0);
  ctx.fillStyle = "#8b949e";
  ctx.font = "12px system-ui";
  L.nodes.forEach((n, h) => {
    const ox = (h % g.perRow) * (g.panelW + 12), oy = Math.floor(h / g.perRow) * g.panelH;
    const gone = ffs.missing[n.index] ? " — " + ffs.missing[n.index] : "";
    ctx.fillText(`host ${n.index} (${n.address})${gone}`, ox, oy + 12);
  });
  const counts = {};
  for (let i = 0; i < f.body.length; i++) if ((i % (1 + f.cells)) !== 0) counts[f.body[i] >> 5] = (counts[f.body[i] >> 5] || 0) + 1;
  const shown = L.total_chunks > L.cells
    ? `${L.cells.toLocaleString()} of the namespace's ${L.total_chunks.toLocaleString()} chunks (those the hosts' kernels ` +
      `count or their caches hold; a name bigger than the map is left out) in ${L.datasets.length} `
    : `${L.cells.toLocaleString()} chunks in ${L.datasets.length} `;
  document.getElementById("summary").textContent = shown +
    `names × ${f.nodes} hosts · frame ${f.seq} · ` +
    Object.entries(counts).map(([s, c]) => `${L.states[s].name}: ${c.toLocaleString()}`).join(" · ");
}

function hover(ev) {
  const L = ffs.layout, f = ffs.frame, g = ffs.geometry;
  if (!L || !f) return;
  const r = grid.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
  const h = Math.floor(y / g.panelH) * g.perRow + Math.floor(x / (g.panelW + 12));
  const cx = Math.floor((x % (g.panelW + 12)) / g.cell), cy = Math.floor((y % g.panelH - g.labelH) / g.cell);
  const i = cy * g.cols + cx;
  if (h >= f.nodes || cx >= g.cols || cy < 0 || i >= f.cells) { tip.style.display = "none"; return; }
  let d = 0;
  while (d + 1 < L.datasets.length && L.offsets[d + 1] <= i) d++;
  const ds = L.datasets[d], c = i - L.offsets[d];
  const on = (k) => f.body[k * (1 + f.cells) + 1 + i];
  const cached = L.nodes.filter((n, k) => (on(k) >> 5) === 3).map(n => n.index);
  tip.textContent = `${ds.name} (${ds.layout}) chunk ${c}\n${ds.keys[c]}\nholders: ${ds.holders[c].join(", ")}\n` +
    `host ${L.nodes[h].index}: ${L.states[on(h) >> 5].name}, count ${on(h) & 31}\n` +
    `cached on: ${cached.length ? cached.join(", ") : "none"}`;
  tip.style.left = (ev.clientX + 14) + "px";
  tip.style.top = (ev.clientY + 14) + "px";
  tip.style.display = "block";
}
grid.addEventListener("mousemove", hover);
grid.addEventListener("mouseleave", () => { tip.style.display = "none"; });

async function onFrame(buf) {
  const dv = new DataView(buf);
  if (buf.byteLength < HEADER || dv.getUint32(0, true) !== MAGIC) return;
  const seq = dv.getUint32(4, true), layoutId = dv.getUint32(8, true);
  const nodes = dv.getUint16(12, true), cells = dv.getUint32(14, true);
  if (!ffs.layout || ffs.layout.id !== layoutId) {
    await loadLayout();
    if (ffs.layout.id !== layoutId) return;  // the namespace changed again meanwhile: next frame
  }
  ffs.frame = {seq, nodes, cells, body: new Uint8Array(buf, HEADER)};
  ffs.frames++;
  draw();
  if (ffs.firstFrameMs === undefined) ffs.firstFrameMs = performance.now();  // since navigation began
}

function connect() {
  const url = new URL("ws/kernel", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => setStatus("live", "live");
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") {
      const msg = JSON.parse(ev.data);
      ffs.missing = msg.missing || {};
      document.getElementById("missing").textContent = Object.keys(ffs.missing).length ?
        "missing: " + Object.entries(ffs.missing).map(([n, why]) => `host ${n}: ${why}`).join("; ") : "";
      if (ffs.frame) draw();
    } else onFrame(ev.data);
  };
  ws.onclose = () => {
    setStatus("disconnected — reconnecting", "down");
    setTimeout(() => { ffs.reconnects++; connect(); }, 1000);
  };
}

// -- timelines ------------------------------------------------------------------------
const PALETTE = ["#58a6ff", "#f78166", "#3fb950", "#d2a8ff", "#ffa657", "#79c0ff", "#ff7b72", "#a5d6ff"];
const CHARTS = [
  {title: "reads per second", unit: "/s", series: [["minio_reads", "MinIO"], ["cache_reads", "cache"]]},
  {title: "read latency (ms)", unit: "ms", log: true,
   series: [["read_p50_ms", "p50"], ["read_p99_ms", "p99"], ["kernel_p50_ms", "kernel p50"]]},
  {title: "kernel and cache events per second", unit: "/s",
   series: [["hot_events", "HOT"], ["fills", "fills"], ["evictions", "evictions"]]},
];

function buildData(tl) {
  const hosts = Object.keys(tl.nodes).sort((a, b) => a - b);
  return CHARTS.map(spec => {
    const series = [{}], data = [tl.time];
    hosts.forEach((h, k) => spec.series.forEach(([key, label], j) => {
      series.push({label: `host ${h} ${label}`, stroke: PALETTE[k % PALETTE.length], width: 1.5,
                   dash: j ? [4 + 3 * j, 3] : undefined, spanGaps: false});
      data.push(tl.nodes[h][key]);
    }));
    return {spec, series, data};
  });
}

async function refreshTimeline() {
  try {
    const r = await fetch("api/timeline");
    if (!r.ok) return;
    const tl = ffs.timeline = await r.json();
    const built = buildData(tl);
    const shape = built.map(b => b.series.length).join(",");
    if (ffs.charts.length && ffs.chartShape === shape) {
      built.forEach((b, k) => ffs.charts[k].setData(b.data));
      return;
    }
    ffs.charts.forEach(c => c.destroy());
    const box = document.getElementById("charts");
    box.innerHTML = "";
    ffs.chartShape = shape;
    ffs.charts = built.map(b => new uPlot({
      title: b.spec.title, width: Math.min(560, window.innerWidth - 40), height: 220, series: b.series,
      scales: {y: b.spec.log ? {distr: 3} : {}},
      axes: [{stroke: "#8b949e"}, {stroke: "#8b949e", label: b.spec.unit}],
    }, b.data, box));
  } catch (err) { /* the dashboard restarts: the next round tries again */ }
}

connect();
refreshTimeline();
setInterval(refreshTimeline, 2000);
