// /runs: a job's run reports drawn as charts (uPlot), two runs side by side. Every figure is
// read from the run's own JSON report (/runs/<run>/<job>.json), nothing computed beyond the
// ideal line of Demo B (its 1-node throughput times the nodes).
"use strict";

const ffsRuns = window.ffsRuns = {charts: [], reports: {}};
const PALETTE = ["#58a6ff", "#f78166", "#3fb950", "#d2a8ff", "#ffa657", "#79c0ff"];
const bars = uPlot.paths.bars({size: [0.6, 60]});

function categories(names) {  // an x axis of names at 0, 1, 2, ...
  return {space: 10, incrs: [1], values: (u, ticks) => ticks.map(i => names[i] !== undefined ? names[i] : ""),
          rotate: -30, size: 90, stroke: "#8b949e"};
}

const JOBS = {
  demo_a: r => {
    const names = Object.keys(r.passes);
    return [{title: "read p50 per pass (ms)", x: names.map((_, i) => i), axis: categories(names), log: true,
             series: [{label: "p50 ms", values: names.map(n => r.passes[n].p50_ms), bars: true},
                      {label: "p99 ms", values: names.map(n => r.passes[n].p99_ms)}]}];
  },
  demo_b: r => {
    const layouts = [...new Set(r.runs.map(x => x.layout))];
    const nodes = [...new Set(r.runs.map(x => x.nodes))].sort((a, b) => a - b);
    const one = r.runs.find(x => x.nodes === 1);
    const series = layouts.map(l => ({label: `${l} MB/s`,
      values: nodes.map(n => (r.runs.find(x => x.nodes === n && x.layout === l) || {}).mb_s ?? null)}));
    if (one) series.push({label: "ideal (1 node x N)", values: nodes.map(n => one.mb_s * n), dash: true});
    return [{title: "throughput by nodes (MB/s)", x: nodes, series}];
  },
  graysort: r => {
    const phases = Object.keys(r.times);
    const tl = (r.timeline || []).slice(0, 60);
    const t = [...new Set(tl.flatMap(k => [k.start_s, k.end_s]))].sort((a, b) => a - b);
    return [
      {title: "phases (s)", x: phases.map((_, i) => i), axis: categories(phases),
       series: [{label: "seconds", values: phases.map(p => r.times[p]), bars: true}]},
      {title: "tasks over time (y: node + part / 10)", x: t,
       series: tl.map(k => ({label: `${k.phase}[part ${k.part} @ node ${k.node}]`,
         values: t.map(s => (s >= k.start_s && s <= k.end_s) ? k.node + k.part / 10 + (
           {generate: 0, map: 0.03, reduce: 0.06}[k.phase] || 0) : null)}))},
    ];
  },
  backtest: r => {
    const modes = Object.keys(r.modes);
    const n = Math.max(...modes.map(m => r.modes[m].replay_p50_s.length));
    return [{title: "replay p50 per round (s), with and without the cache", x: [...Array(n).keys()].map(i => i + 1),
             series: modes.map(m => ({label: m, values: r.modes[m].replay_p50_s}))}];
  },
};

function draw(spec, box, width) {
  const series = [{}].concat(spec.series.map((s, k) => ({
    label: s.label, stroke: PALETTE[k % PALETTE.length], width: 1.6, dash: s.dash ? [6, 4] : undefined,
    fill: s.bars ? PALETTE[k % PALETTE.length] + "88" : undefined, paths: s.bars ? bars : undefined,
    points: {show: !s.bars}})));
  return new uPlot({title: spec.title, width, height: 260, series,
                    scales: {x: spec.axis ? {time: false, range: [-0.6, spec.x.length - 0.4]} : {time: false},
                             y: spec.log ? {distr: 3} : {}},
                    axes: [spec.axis || {stroke: "#8b949e"}, {stroke: "#8b949e"}]},
                   [spec.x, ...spec.series.map(s => s.values)], box);
}

async function report(run) {
  if (!ffsRuns.reports[run.run]) {
    const name = run.files.find(f => f === run.job + ".json") || run.files.find(f => f.endsWith(".json"));
    const r = await fetch(`runs/${encodeURIComponent(run.run)}/${encodeURIComponent(name)}`);
    ffsRuns.reports[run.run] = await r.json();
  }
  return ffsRuns.reports[run.run];
}

async function show() {
  const job = document.getElementById("job").value;
  const a = document.getElementById("a").value, b = document.getElementById("b").value;
  const runs = ffsRuns.runs.filter(r => r.job === job);
  const picked = [a, b].filter((x, i, all) => x && all.indexOf(x) === i).map(x => runs.find(r => r.run === x));
  ffsRuns.charts.forEach(c => c.destroy());
  ffsRuns.charts = [];
  const box = document.getElementById("side");
  box.innerHTML = "";
  const width = Math.min(620, Math.floor((window.innerWidth - 60) / Math.max(1, picked.length)));
  for (const run of picked) {
    const col = document.createElement("div");
    col.innerHTML = `<h3>${run.run}</h3><p class="muted">${Object.entries(run.headline)
      .map(([k, v]) => `${k}: <b>${v}</b>`).join(" · ")}</p>`;
    box.appendChild(col);
    for (const spec of JOBS[job](await report(run))) ffsRuns.charts.push(draw(spec, col, width));
  }
  ffsRuns.shown = picked.map(r => r.run);
}

function fillRuns() {
  const job = document.getElementById("job").value;
  const runs = ffsRuns.runs.filter(r => r.job === job);
  for (const id of ["a", "b"]) {
    document.getElementById(id).innerHTML = runs.map(r => `<option>${r.run}</option>`).join("");
  }
  if (runs.length > 1) document.getElementById("b").value = runs[1].run;
  show();
}

async function start() {
  ffsRuns.runs = await (await fetch("api/runs")).json();
  const jobs = [...new Set(ffsRuns.runs.map(r => r.job))].filter(j => JOBS[j]);
  const sel = document.getElementById("job");
  sel.innerHTML = jobs.map(j => `<option>${j}</option>`).join("");
  const wanted = new URLSearchParams(location.search).get("job");
  if (wanted && jobs.includes(wanted)) sel.value = wanted;
  sel.onchange = fillRuns;
  document.getElementById("a").onchange = show;
  document.getElementById("b").onchange = show;
  if (jobs.length) fillRuns();
  else document.getElementById("side").textContent = "no runs of Demo A, Demo B, GraySort or the backtest yet";
}
start();
