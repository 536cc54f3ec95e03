// The Usage page's chart: GPU-hours (or CPU-hours, when no GPU was used) per team per UTC day, one series per
// team, from the data the server embedded (data-chart: {days: [epoch seconds], unit, teams: [{team, hours}]}).
// The x range is the data's days (half a day either side, so each day's bars sit on its tick), never
// uPlot's automatic range (one day of data would span years). Uses the Job Charts' palette and ticks
// (charts.js: window.TunePlaneCharts).
(function () {
  "use strict";
  const DAY = 86400;
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const dayLabel = v => { const d = new Date(v * 1000); return MONTHS[d.getUTCMonth()] + " " + d.getUTCDate(); };
  function draw() {
    const el = document.getElementById("usage-chart");
    if (!el || !window.uPlot || !window.TunePlaneCharts) return;
    const { palette, yAxis } = window.TunePlaneCharts;
    const data = JSON.parse(el.dataset.chart);
    const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8 / Math.max(1, data.teams.length), 60] }) : null;
    const series = [{ label: "day", value: (u, v) => (v == null ? "" : dayLabel(v)) }];
    data.teams.forEach((t, i) => {
      const color = palette[i % palette.length];
      series.push({ label: t.team, stroke: color, fill: color + "55", width: 1.5, paths: bars, points: { show: !bars } });
    });
    const first = data.days[0], last = data.days[data.days.length - 1];
    el.textContent = "";
    // What a reader sees, kept on the element so that it can be checked (uPlot draws on a canvas).
    const shown = u => {
      el.dataset.xRange = JSON.stringify([u.scales.x.min, u.scales.x.max]);
      el.dataset.xTicks = JSON.stringify((u.axes[0]._values || []).map(String));
    };
    new uPlot({
      width: Math.max(320, el.clientWidth || 600), height: 260, series, hooks: { drawAxes: [shown] },
      scales: { x: { time: true, range: () => [first - DAY / 2, last + DAY / 2] } },
      axes: [
        { label: "day (UTC)", incrs: [DAY, 2 * DAY, 7 * DAY, 14 * DAY, 28 * DAY], values: (u, vals) => vals.map(dayLabel) },
        { ...yAxis, label: data.unit || "GPU-hours" },
      ],
    }, [data.days, ...data.teams.map(t => t.hours)], el);
    el.dataset.drawn = String(data.teams.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
