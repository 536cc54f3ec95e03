// Job Charts: draws each .tp-chart with uPlot from the bounded /jobs/<id>/metrics endpoint of one or more
// jobs (data-sources: [{job, url}]); one line per (job, attempt, member, source, name) with its min–max
// band. Controls (#tp-x, #tp-log, #tp-smooth) apply to every chart: x by step, relative time (seconds
// since the series' first bucket) or wall time (always for host and GPU samples, whose step is a time),
// log scale, and smoothing computed by the server on the
// full series (a trailing mean over a window of steps, the same at every zoom). A bucket
// whose last value is NaN or ±Infinity is a gap with a red marker at the top. Export writes exactly the
// plotted columns (CSV or JSON). Redraws when the htmx live tick reports new data.
(function () {
  "use strict";
  const palette = ["#2456d6", "#d6243a", "#1e7b34", "#9a6700", "#7a2bd6", "#0b8a8a", "#c25e00", "#555"];
  const charts = new Map();   // element → uPlot
  const plotted = new Map();  // element → {columns, rows}: what is drawn, for export

  function tick(v) {
    if (v == null) return "";
    if (v !== 0 && Math.abs(v) < 1e-4) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }
  const yAxis = { values: (u, vals) => vals.map(tick), size: 60 };

  // Bytes in binary units (256 MiB, 1.5 GiB), ticks on binary steps so that labels come out round.
  const BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function bytes(v) {
    if (v == null) return "";
    let n = Math.abs(v), k = 0;
    while (n >= 1024 && k < BINARY.length - 1) { n /= 1024; k++; }
    return (v < 0 ? "-" : "") + String(+n.toPrecision(3)) + " " + BINARY[k];
  }
  const binaryIncrs = [];
  for (let k = 0; k < 6; k++) for (const m of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]) binaryIncrs.push(m * 1024 ** k);
  const yAxes = {
    bytes: { values: (u, vals) => vals.map(bytes), incrs: binaryIncrs, size: 80 },
    // 100 % is one core: a member busy on four cores reads 400 %.
    percent: { values: (u, vals) => vals.map(v => (v == null ? "" : tick(v) + " %")), size: 70 },
    watts: { values: (u, vals) => vals.map(v => (v == null ? "" : tick(v) + " W")), size: 70 },
  };

  // A span of seconds as people say it: 45 s, 2 min 30 s, 3 h 10 min, 2 d 4 h.
  function duration(seconds) {
    const sign = seconds < 0 ? "-" : "", t = Math.round(Math.abs(seconds));
    if (t < 60) return sign + t + " s";
    const m = Math.floor(t / 60), s = t % 60;
    if (m < 60) return sign + m + " min" + (s ? " " + s + " s" : "");
    const h = Math.floor(m / 60), mm = m % 60;
    if (h < 24) return sign + h + " h" + (mm ? " " + mm + " min" : "");
    const d = Math.floor(h / 24), hh = h % 24;
    return sign + d + " d" + (hh ? " " + hh + " h" : "");
  }
  // Whole seconds and up (a 10 s job gets 1 s or 2 s ticks, never :13.500), then minutes, hours, days.
  const timeIncrs = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                     86400, 172800, 345600, 604800, 1209600, 2592000];
  const pad = n => String(n).padStart(2, "0");
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  // A wall-clock tick (UTC, as the rest of the console) with as much as the visible range needs:
  // seconds for a range under ten minutes, the day once it spans more than one.
  function wallTicks(u, vals) {
    const range = u.scales.x.max - u.scales.x.min;
    return vals.map(v => {
      if (v == null) return "";
      const d = new Date(v * 1000);
      const hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
      const day = MONTHS[d.getUTCMonth()] + " " + d.getUTCDate();
      if (range < 600) return hm + ":" + pad(d.getUTCSeconds());
      if (range < 86400) return hm;
      if (range < 14 * 86400) return day + " " + hm;
      return day;
    });
  }
  // Steps are whole numbers: no 0.5 ticks on a short run.
  const stepIncrs = [];
  for (let p = 1; p <= 1e15; p *= 10) stepIncrs.push(p, 2 * p, 5 * p);
  const xAxes = {
    step: { incrs: stepIncrs },
    relative: { values: (u, vals) => vals.map(v => (v == null ? "" : duration(v))), incrs: timeIncrs, space: 70 },
    wall: { values: wallTicks, incrs: timeIncrs, space: 90 },
  };
  // Shared with the other charts of the console (usage.js).
  window.TunePlaneCharts = { palette, tick, yAxis, align, bytes, duration, wallTicks, timeIncrs };

  function controls() {
    const log = document.getElementById("tp-log");
    const smooth = document.getElementById("tp-smooth");
    const steps = smooth ? parseInt(smooth.value, 10) : 0;
    const x = document.getElementById("tp-x");
    return { log: !!(log && log.checked), smooth: steps > 0 ? steps : 0, x: x ? x.value : "step" };
  }

  function align(tables) {
    const xs = Array.from(new Set(tables.flatMap(t => t[0]))).sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const out = [xs];
    for (const t of tables) {
      for (let k = 1; k < t.length; k++) {
        // undefined where this series has no point at another series' x: uPlot joins over it, so each
        // series stays one line; null (a NaN bucket) is still drawn as a gap.
        const col = new Array(xs.length).fill(undefined);
        t[0].forEach((x, i) => { col[index.get(x)] = t[k][i]; });
        out.push(col);
      }
    }
    return out;
  }

  // Sources tell series apart: the job (when comparing), attempt, member, source and raw name.
  function labelOf(job, s, many) {
    const copies = s.copies && s.copies.length ? ` (also ${s.copies.join(", ")})` : "";
    return `${many ? "job " + job + " · " : ""}attempt ${s.attempt} · member ${s.member} · ${s.source}${copies} · ${s.name}`;
  }

  // Host and GPU samples (source "system", workers/collector/system.py) have a time in milliseconds as
  // their step: a chart holding only such series is drawn against wall time when the x control says step
  // (a step axis would read 1764778000000).
  function xModeOf(payloads, opts) {
    const all = payloads.flatMap(p => p.payload.series);
    return opts.x === "step" && all.length && all.every(s => s.source === "system") ? "wall" : opts.x;
  }

  // A metric written twice by the same member (the demo writes JSONL and TensorBoard) is drawn once: the
  // server marks which copy is kept (`copy_of`, app/telemetry/queries.py mark_copies, the rule `tuneplane
  // metrics` follows too). The copies' sources (`copies`) are named in the line's label.
  function onePerMetric(series) {
    return series.filter(s => !s.copy_of).sort((a, b) => a.attempt - b.attempt || a.member - b.member);
  }

  function build(payloads, requested) {
    const opts = { ...requested, x: xModeOf(payloads, requested) };
    const xLabel = { step: "step", relative: "time since start", wall: "wall time (UTC)" }[opts.x] || "step";
    const tables = [], series = [{ label: xLabel }], bands = [], names = [], markers = [];
    const many = payloads.length > 1;
    const positive = v => (opts.log && v != null && v <= 0 ? null : v);
    let i = 0;
    for (const { job, payload } of payloads) {
      for (const s of onePerMetric(payload.series)) {
        // Time axes need each bucket's wall time (buckets stored before it was kept have none).
        const b = opts.x === "step" ? s.buckets : s.buckets.filter(x => x.last_wall != null);
        const start = b.length ? b[0].last_wall : 0;
        const xOf = opts.x === "step" ? (x => x.last_step) : opts.x === "wall" ? (x => x.last_wall) : (x => x.last_wall - start);
        const line = b.map(x => positive(opts.smooth ? (x.smoothed ?? null) : x.mean));
        tables.push([b.map(xOf), line, b.map(x => positive(x.min)), b.map(x => positive(x.max))]);
        b.forEach(x => { if (x.non_finite && x.mean == null) markers.push({ x: xOf(x), kind: x.non_finite }); });
        const color = palette[i % palette.length];
        const name = labelOf(job, s, many) + (opts.smooth ? ` (smoothed ${opts.smooth})` : "");
        const base = series.length;
        series.push({ label: name, stroke: color, width: 1.5, spanGaps: false });
        series.push({ label: name + " min", stroke: color + "55", width: 0.5, spanGaps: false });
        series.push({ label: name + " max", stroke: color + "55", width: 0.5, spanGaps: false });
        bands.push({ series: [base + 2, base + 1], fill: color + "22" });
        names.push(name);
        i++;
      }
    }
    const data = tables.length ? align(tables) : [[]];
    return { data, series, bands, names, markers, xLabel, x: opts.x };
  }

  // Red ticks at the top of the plot where a bucket ended on NaN or ±Infinity.
  function markerPlugin(markers) {
    return {
      hooks: {
        draw: [u => {
          const ctx = u.ctx;
          ctx.save();
          ctx.fillStyle = "#d6243a";
          for (const m of markers) {
            const x = u.valToPos(m.x, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath();
            ctx.moveTo(x - 4, u.bbox.top);
            ctx.lineTo(x + 4, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + 8);
            ctx.fill();
          }
          ctx.restore();
        }],
      },
    };
  }

  // The x axis's tick labels as drawn (uPlot draws them on the canvas), kept on the element so that what
  // a reader sees ("14:05", not "1764778000000") can be checked.
  function ticksPlugin(el) {
    return { hooks: { drawAxes: [u => {
      el.dataset.xTicks = JSON.stringify((u.axes[0]._values || []).map(String));
      el.dataset.yTicks = JSON.stringify((u.axes[1]._values || []).map(String));
    }] } };
  }

  // The legend lists each line once: its min and max series (the band's edges) are not entries of their own.
  function bandLegendPlugin() {
    return { hooks: { init: [u => {
      u.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
        if (i > 0 && (i - 1) % 3 !== 0) row.style.display = "none";
      });
    }] } };
  }

  function remember(el, built) {
    const columns = [built.xLabel];
    built.names.forEach(n => { columns.push(n, n + " min", n + " max"); });
    const rows = built.data[0].map((x, r) => built.data.map(col => col[r]));
    plotted.set(el, { columns, rows, markers: built.markers });
    el.dataset.plottedRows = String(rows.length);
  }

  async function draw(el) {
    const opts = controls();
    const sources = JSON.parse(el.dataset.sources);
    const payloads = [];
    for (const source of sources) {
      const url = source.url + (opts.smooth ? `&smooth=${opts.smooth}` : "");
      const response = await fetch(url, { headers: { Accept: "application/json" } });
      if (!response.ok) { el.textContent = "could not load: HTTP " + response.status; return; }
      payloads.push({ job: source.job, payload: await response.json() });
    }
    const built = build(payloads, opts);
    remember(el, built);
    const existing = charts.get(el);
    if (existing) existing.destroy();
    const target = el.querySelector(".tp-plot") || el;
    const unit = el.dataset.unit || "";
    const uopts = {
      width: Math.max(320, target.clientWidth || 600), height: 260,
      series: built.series, bands: built.bands,
      plugins: [markerPlugin(built.markers), ticksPlugin(el), bandLegendPlugin()],
      scales: { x: { time: built.x === "wall" }, y: opts.log ? { distr: 3 } : {} }, legend: { live: true },
      axes: [{ label: built.xLabel, ...(xAxes[built.x] || {}) }, { ...yAxis, ...(yAxes[unit] || {}) }],
    };
    charts.set(el, new uPlot(uopts, built.data, target));
    el.dataset.drawn = [opts.log ? "log" : "linear", opts.smooth || 0, built.names.length].join(":");
    el.dataset.x = built.x;
  }

  function csvCell(v) {
    if (v == null) return "";
    const text = String(v);
    return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
  }

  function exportChart(el, format) {
    const p = plotted.get(el);
    if (!p) return;
    let body, type;
    if (format === "csv") {
      body = [p.columns, ...p.rows].map(r => r.map(csvCell).join(",")).join("\n") + "\n";
      type = "text/csv";
    } else {
      body = JSON.stringify({ columns: p.columns, rows: p.rows, non_finite: p.markers }, null, 1);
      type = "application/json";
    }
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([body], { type }));
    link.download = `${el.dataset.name || "chart"}.${format}`;
    document.body.appendChild(link);
    link.click();
    link.remove();
  }

  function drawAll() {
    document.querySelectorAll(".tp-chart[data-sources]").forEach(el => { draw(el); });
  }

  let version = null;
  document.addEventListener("DOMContentLoaded", () => {
    const live = document.getElementById("tp-live");
    version = live ? live.dataset.version : null;
    drawAll();
    ["tp-x", "tp-log", "tp-smooth"].forEach(id => {
      const input = document.getElementById(id);
      if (input) input.addEventListener("change", drawAll);
    });
    document.addEventListener("click", event => {
      const button = event.target.closest && event.target.closest("[data-export]");
      if (button) exportChart(button.closest(".tp-chart-card").querySelector(".tp-chart"), button.dataset.export);
    });
  });
  document.addEventListener("htmx:afterSwap", (event) => {
    const live = document.getElementById("tp-live");
    if (live && live.dataset.version !== version) { version = live.dataset.version; drawAll(); }
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
