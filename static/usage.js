// The Usage page's chart: GPU-hours per team per UTC day, one series per team, from the data the server
// embedded (data-chart: {days: [epoch seconds], teams: [{team, gpu_hours: [...]}]}). Uses the Job Charts'
// palette and axis ticks (charts.js: window.TunePlaneCharts).
(function () {
  "use strict";
  function draw() {
    const el = document.getElementById("usage-chart");
    if (!el || !window.uPlot || !window.TunePlaneCharts) return;
    const { palette, yAxis } = window.TunePlaneCharts;
    const data = JSON.parse(el.dataset.chart);
    const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8 / Math.max(1, data.teams.length), 60] }) : null;
    const series = [{ label: "day" }];
    data.teams.forEach((t, i) => {
      const color = palette[i % palette.length];
      series.push({ label: t.team, stroke: color, fill: color + "55", width: 1.5, paths: bars, points: { show: !bars } });
    });
    el.textContent = "";
    new uPlot({
      width: Math.max(320, el.clientWidth || 600), height: 260, series,
      scales: { x: { time: true } }, axes: [{ label: "day (UTC)" }, { ...yAxis, label: "GPU-hours" }],
    }, [data.days, ...data.teams.map(t => t.gpu_hours)], el);
    el.dataset.drawn = String(data.teams.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
