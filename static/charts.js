// Job Charts: draws each .tp-chart with uPlot from the bounded /jobs/<id>/metrics endpoint; one line per
// (attempt, member, source) with its min-max band; redraws when the htmx live tick reports new data.
(function () {
  "use strict";
  const palette = ["#2456d6", "#d6243a", "#1e7b34", "#9a6700", "#7a2bd6", "#0b8a8a", "#c25e00", "#555"];
  const charts = new Map();

  // Small values (learning rates) need more than uPlot's default precision on the y axis.
  function tick(v) {
    if (v == null) return "";
    if (v !== 0 && Math.abs(v) < 0.01) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }
  const yAxis = { values: (u, vals) => vals.map(tick), size: 60 };

  function align(tables) {
    const xs = Array.from(new Set(tables.flatMap(t => t[0]))).sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const out = [xs];
    for (const t of tables) {
      for (let k = 1; k < t.length; k++) {
        const col = new Array(xs.length).fill(null);
        t[0].forEach((x, i) => { col[index.get(x)] = t[k][i]; });
        out.push(col);
      }
    }
    return out;
  }

  function build(el, payload) {
    const tables = [], series = [{ label: "step" }], bands = [];
    payload.series.forEach((s, i) => {
      const b = s.buckets;
      tables.push([b.map(x => x.last_step), b.map(x => x.mean), b.map(x => x.min), b.map(x => x.max)]);
      const color = palette[i % palette.length];
      const name = `a${s.attempt} m${s.member} ${s.name}`;
      const base = series.length;
      series.push({ label: name, stroke: color, width: 1.5, spanGaps: true });
      series.push({ label: name + " min", stroke: color + "55", width: 0.5, spanGaps: true, show: true });
      series.push({ label: name + " max", stroke: color + "55", width: 0.5, spanGaps: true, show: true });
      bands.push({ series: [base + 2, base + 1], fill: color + "22" });
    });
    return { data: tables.length ? align(tables) : [[]], series, bands };
  }

  async function draw(el) {
    const response = await fetch(el.dataset.url, { headers: { Accept: "application/json" } });
    if (!response.ok) { el.textContent = "could not load: HTTP " + response.status; return; }
    const payload = await response.json();
    const built = build(el, payload);
    const existing = charts.get(el);
    if (existing && existing.series.length === built.series.length) {
      existing.setData(built.data, true);
      return;
    }
    if (existing) existing.destroy();
    const opts = {
      width: Math.max(320, el.clientWidth || 600), height: 260,
      series: built.series, bands: built.bands,
      scales: { x: { time: false } }, legend: { live: true }, axes: [{}, yAxis],
    };
    charts.set(el, new uPlot(opts, built.data, el));
  }

  function drawAll() {
    document.querySelectorAll(".tp-chart[data-url]").forEach(el => { draw(el); });
  }

  let version = null;
  document.addEventListener("DOMContentLoaded", () => {
    const live = document.getElementById("tp-live");
    version = live ? live.dataset.version : null;
    drawAll();
  });
  document.addEventListener("htmx:afterSwap", (event) => {
    const live = document.getElementById("tp-live");
    if (live && event.detail.target && event.detail.target.id === "tp-live" || (live && live.dataset.version !== version)) {
      if (live.dataset.version !== version) { version = live.dataset.version; drawAll(); }
    }
    const raw = event.detail.target && event.detail.target.querySelector && event.detail.target.querySelector(".tp-raw-chart");
    if (raw) {
      const xs = JSON.parse(raw.dataset.points), ys = JSON.parse(raw.dataset.values);
      new uPlot({ width: Math.max(320, raw.clientWidth || 600), height: 200, scales: { x: { time: false } },
                  axes: [{}, yAxis],
                  series: [{ label: "step" }, { label: "value", stroke: palette[0], points: { show: xs.length < 300 } }] },
                [xs, ys], raw);
    }
  });
})();
