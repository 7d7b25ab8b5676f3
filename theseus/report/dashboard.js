// theseus report: draws window.THESEUS.data with plotly.js; polls data.json when live.
// Runs are toggled in the runs table (the charts carry no legend of their own, so none can
// cover the data); smoothing, the x axis and a log y axis apply to every chart.
"use strict";
(function () {
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf", "#393b79", "#e6550d", "#31a354", "#843c39", "#7b4173", "#3182bd"];
  const X = {step: [0, "step"], tokens: [1, "tokens"], time: [2, "training time (s)"]};
  const state = {data: window.THESEUS.data, hidden: new Set(), smoothing: 0, x: "step", logy: false,
                 sort: {}};
  const app = document.getElementById("app");
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const color = (i) => COLORS[i % COLORS.length];

  function smooth(values, weight) {
    // TensorBoard's debiased exponential moving average.
    if (!weight) return values;
    let last = 0, n = 0;
    return values.map((v) => { if (v === null) return null; last = last * weight + (1 - weight) * v; n += 1;
                               return last / (1 - Math.pow(weight, n)); });
  }

  function skeleton() {
    app.innerHTML = `
      <header><h1 id=title></h1><div class=paths id=paths></div><div class=updated id=updated></div></header>
      <section class=controls>
        <label>x axis <select id=xaxis><option value=step>steps</option><option value=tokens>tokens</option>
          <option value=time>training time</option></select></label>
        <label>smoothing <input id=smoothing type=range min=0 max=0.99 step=0.01 value=0><output id=smoothing-value>0</output></label>
        <label><input id=logy type=checkbox> log y axis</label>
        <span class=hint>drag to zoom, double-click to reset; click a run to hide or show it</span>
      </section>
      <section><h2>Runs</h2><div id=runs></div></section>
      <section id=seeds-section><h2>Seeds</h2><div id=seeds></div></section>
      <section id=parallel-section><h2>Swept keys against the final val_loss</h2><div id=parallel class=parallel></div></section>
      <section><h2>Charts</h2><div id=charts class=charts></div></section>
      <section id=samples-section><h2>Samples</h2><div id=samples></div></section>`;
    document.getElementById("xaxis").onchange = (e) => { state.x = e.target.value; drawCharts(); };
    document.getElementById("smoothing").oninput = (e) => {
      state.smoothing = Number(e.target.value); document.getElementById("smoothing-value").textContent = e.target.value; drawCharts(); };
    document.getElementById("logy").onchange = (e) => { state.logy = e.target.checked; drawCharts(); };
  }

  function progress(run) {
    const of = run.max_steps ? ` / ${run.max_steps}` : "";
    return `${run.step}${of}`;
  }

  function sortable(id, columns, rows, cellsOf) {
    // A table whose header cells sort it (click again: the other way).
    const s = state.sort[id] || {key: null, down: false};
    const order = rows.map((r, i) => i);
    if (s.key !== null) {
      order.sort((a, b) => {
        const va = rows[a].sort[s.key], vb = rows[b].sort[s.key];
        if (va === vb) return 0; if (va === null || va === undefined) return 1; if (vb === null || vb === undefined) return -1;
        return (va < vb ? -1 : 1) * (s.down ? -1 : 1);
      });
    }
    const head = columns.map((c) => `<th data-key="${esc(c.key)}" class="${c.num ? "num" : ""}${s.key === c.key ? (s.down ? " down" : " up") : ""}">${esc(c.label)}</th>`).join("");
    const body = order.map((i) => cellsOf(rows[i], i)).join("");
    const el = document.getElementById(id);
    el.innerHTML = `<table class=sortable><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
    el.querySelectorAll("th").forEach((th) => th.onclick = () => {
      const key = th.dataset.key; state.sort[id] = {key, down: s.key === key ? !s.down : false}; drawTables(); });
  }

  function drawRuns() {
    const d = state.data;
    const runs = d.runs.map((r, i) => ({...r, index: i, sort: {...r.sort, run: r.label, status: r.status}}));
    const columns = [{key: "run", label: "run"}, {key: "status", label: "status"}, {key: "step", label: "step", num: true},
                     {key: "eta", label: "ETA"}, ...d.differing.map((k) => ({key: k, label: k})),
                     {key: "loss", label: "loss", num: true}, {key: "val_loss", label: "val_loss", num: true},
                     {key: "tokens_per_s", label: "tokens/s", num: true}, {key: "mfu", label: "MFU", num: true}];
    runs.forEach((r) => r.sort.eta = r.eta);
    sortable("runs", columns, runs, (r) => `
      <tr class="run ${esc(r.status)}${state.hidden.has(r.path) ? " hidden" : ""}" data-path="${esc(r.path)}" title="${esc(r.path)}">
        <td class=label><span class=swatch style="background:${color(r.index)}"></span>${esc(r.label)}</td>
        <td class=status><span class="badge ${esc(r.status)}">${esc(r.status)}</span>${r.error ? `<div class=error>${esc(r.error)}</div>` : ""}</td>
        <td class="num progress">${esc(progress(r))}</td><td class=eta>${r.eta ? "ETA " + esc(r.eta) : ""}</td>
        ${d.differing.map((k) => `<td>${esc(r.differs[k])}</td>`).join("")}
        <td class=num>${esc(r.final.loss)}</td><td class=num>${esc(r.final.val_loss)}</td>
        <td class=num>${esc(r.final.tokens_per_s)}</td><td class=num>${esc(r.final.mfu)}</td></tr>`);
    document.querySelectorAll("#runs tr.run").forEach((tr) => tr.onclick = () => {
      const p = tr.dataset.path; state.hidden.has(p) ? state.hidden.delete(p) : state.hidden.add(p); drawTables(); drawCharts(); });
  }

  function drawSeeds() {
    const s = state.data.seeds, section = document.getElementById("seeds-section");
    section.hidden = !s;
    if (!s) return;
    const pct = Math.round(s.level * 100);
    const note = s.single_seed
      ? `<p class=note>Single seed: each setting ran once, so these differences are not tested against seed noise. Sweep <code>trainer.seed</code> beside the other keys to get intervals and p-values.</p>`
      : `<p class=note>Runs grouped by everything but ${s.seeds.map((k) => `<code>${esc(k)}</code>`).join(", ")}: the mean final ${esc(s.metric)} with its ${pct}% confidence interval, and Welch's one-sided t-test that the best group is lower (p &lt; 0.01: the claim holds).</p>`;
    const rows = s.groups.map((g, i) => ({...g, sort: {group: g.label, n: g.n, mean: g.mean, ci: g.ci, p: g.p}, best: i === 0}));
    const columns = [{key: "group", label: "group"}, {key: "n", label: "seeds", num: true}, {key: "mean", label: `mean ${s.metric}`, num: true},
                     {key: "ci", label: `± ${pct}% CI`, num: true}, {key: "p", label: "p (best lower)", num: true}];
    document.getElementById("seeds").innerHTML = note + "<div id=seed-table></div>";
    sortable("seed-table", columns, rows, (g) => `<tr class="group${g.best ? " best" : ""}">
      <td>${esc(g.label)}${g.best ? " <b>(best)</b>" : ""}</td><td class=num>${g.n}</td><td class=num>${g.mean.toFixed(4)}</td>
      <td class=num>${g.ci === null ? "single seed" : g.ci.toFixed(4)}</td>
      <td class=num>${g.best ? "" : g.p === null ? "n/a" : (g.p < 1e-4 ? g.p.toExponential(1) : g.p.toFixed(4)) + (g.p < 0.01 ? " ✓" : "")}</td></tr>`);
  }

  function drawSamples() {
    // Each run's latest evaluation examples (a GRPO run's prompts, completions and rewards).
    const runs = state.data.runs.filter((r) => r.samples && r.samples.length && !state.hidden.has(r.path));
    document.getElementById("samples-section").hidden = !runs.length;
    const text = (v) => typeof v === "string" ? v : Array.isArray(v) ? v.map((m) => m.content ?? JSON.stringify(m)).join(" / ") : JSON.stringify(v);
    document.getElementById("samples").innerHTML = runs.map((r) => {
      const keys = Object.keys(r.samples[0]).filter((k) => !["step", "prompt", "completion"].includes(k));
      return `<h3>${esc(r.label)}: step ${esc(r.samples[0].step)}</h3><table class=samples><thead><tr><th>prompt</th><th>completion</th>${
        keys.map((k) => `<th class=num>${esc(k)}</th>`).join("")}</tr></thead><tbody>${r.samples.map((s) => `<tr><td><pre>${
        esc(text(s.prompt))}</pre></td><td><pre>${esc(text(s.completion))}</pre></td>${
        keys.map((k) => `<td class=num>${esc(s[k])}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
    }).join("");
  }

  function drawTables() { drawRuns(); drawSeeds(); drawSamples(); }

  function drawParallel() {
    const p = state.data.parallel, section = document.getElementById("parallel-section");
    section.hidden = !p;
    if (!p) return;
    const dims = p.dimensions.map((d) => ({...d}));
    Plotly.react("parallel", [{type: "parcoords", dimensions: dims,
      line: {color: p.color, colorscale: "Viridis", reversescale: true, showscale: true, colorbar: {title: {text: "val_loss"}}}}],
      {margin: {l: 80, r: 80, t: 50, b: 30}, height: 360, uirevision: "parallel"}, {displaylogo: false, responsive: true});
  }

  function drawCharts() {
    const d = state.data, holder = document.getElementById("charts");
    const [column, label] = X[state.x];
    const keys = d.charts.map((c) => c.key);
    holder.querySelectorAll(".chart").forEach((el) => { if (!keys.includes(el.dataset.key)) { Plotly.purge(el); el.remove(); } });
    if (!d.charts.length) holder.innerHTML = "<p>no metrics logged yet</p>";
    else holder.querySelectorAll("p").forEach((p) => p.remove());
    d.charts.forEach((chart) => {
      let el = holder.querySelector(`.chart[data-key="${CSS.escape(chart.key)}"]`);
      if (!el) { el = document.createElement("div"); el.className = "chart"; el.dataset.key = chart.key; holder.appendChild(el); }
      const traces = [];
      d.runs.forEach((run, i) => {
        const points = (run.series[chart.key] || []).filter((p) => p[column] !== null);
        if (!points.length || state.hidden.has(run.path)) return;
        const x = points.map((p) => p[column]), y = points.map((p) => p[3]);
        const steps = points.map((p) => p[0]);
        const lone = points.length === 1;
        if (state.smoothing && !lone) traces.push({x, y, type: "scatter", mode: "lines", line: {color: color(i), width: 1},
                                                    opacity: 0.25, hoverinfo: "skip", showlegend: false, meta: "raw"});
        traces.push({x, y: smooth(y, lone ? 0 : state.smoothing), customdata: steps, name: run.label, type: "scatter",
                     mode: lone ? "markers" : "lines", line: {color: color(i), width: 2}, marker: {color: color(i), size: 7},
                     meta: run.path, hovertemplate: `%{fullData.name}<br>step %{customdata}<br>${esc(chart.key)} %{y:${chart.format}}<extra></extra>`});
      });
      Plotly.react(el, traces, {
        title: {text: chart.title, x: 0, xanchor: "left", font: {size: 14}}, showlegend: false, height: 320,
        margin: {l: 60, r: 20, t: 40, b: 45}, hovermode: "closest", uirevision: `${chart.key}-${state.x}-${state.logy}`,
        xaxis: {title: {text: label}, zeroline: false}, yaxis: {type: state.logy ? "log" : "linear", zeroline: false, tickformat: chart.format === ".4g" ? "" : chart.format},
      }, {displaylogo: false, responsive: true});
    });
  }

  function draw() {
    const d = state.data;
    document.getElementById("title").textContent = d.title;
    document.title = "theseus: " + d.title;
    document.getElementById("paths").textContent = d.paths.join("  ");
    drawUpdated(); drawTables(); drawParallel(); drawCharts();
  }

  function drawUpdated() {
    document.getElementById("updated").textContent =
      (window.THESEUS.live ? "live, updated " : "snapshot of ") + new Date(state.data.updated * 1000).toLocaleString();
  }

  skeleton();
  draw();
  if (window.THESEUS.live) {
    setInterval(async () => {
      try {
        const response = await fetch("data.json", {cache: "no-store"});
        if (!response.ok) return;
        const next = await response.json(), updated = next.updated;
        next.updated = state.data.updated;
        if (JSON.stringify(next) === JSON.stringify(state.data)) {  // nothing new: only the time moves
          state.data.updated = updated; drawUpdated(); return;
        }
        next.updated = updated; state.data = next; draw();
      } catch (e) { document.getElementById("updated").textContent = "server stopped: " + e; }
    }, 2000);
  }
})();
