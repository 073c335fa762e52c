// Time-series charts drawn with uPlot (vendored): a time axis, a y axis named with its
// unit, a legend with each series' value under the cursor (the latest step when the
// cursor is elsewhere). Series names may come from agents (redaction types, overflow
// targets): uPlot writes them with textContent, and they are cut to 64 characters.
"use strict";

const CHART_COLOURS = ["#0b3d91", "#b00020", "#116b2f", "#8a5a00", "#6a1b9a", "#00695c",
  "#ad1457", "#37474f", "#5d4037"];
const CHART_HEIGHT = 170;

// A figure as the legend shows it: four significant digits and the unit.
function chartValue(v, unit) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "-";
  return unit ? `${+v.toPrecision(4)} ${unit}` : `${+v.toPrecision(4)}`;
}

function chartTime(t) {
  if (t === null || t === undefined) return "-";
  // the axis's clock (24-hour), not the locale's 12-hour "09:29:10 AM" beside "09:29" ticks
  return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
}

// A time axis tick: "14:05" on a minute, ":30" between (local time, 24-hour).
function timeTick(t) {
  const d = new Date(t * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return d.getSeconds() ? `:${two(d.getSeconds())}` : `${two(d.getHours())}:${two(d.getMinutes())}`;
}

// Dots on values in runs of one or two between gaps (too short a line to see), unless
// uPlot already dots every point (few of them on the chart's width).
function isolatedPoints(u, seriesIdx, show) {
  if (show) return null;
  const d = u.data[seriesIdx];
  const dots = [];
  let run = [];
  for (let i = 0; i <= d.length; i++) {
    if (i < d.length && d[i] !== null && d[i] !== undefined) { run.push(i); continue; }
    if (run.length && run.length <= 2) dots.push(...run);
    run = [];
  }
  return dots.length ? dots : null;
}

class TimeChart {
  // spec: {id, title, unit, axis (the y axis' name), series: [label, ...]}
  constructor(parent, spec) {
    this.spec = spec;
    this.box = document.createElement("figure");
    this.box.className = "chart";
    this.box.id = spec.id;
    const caption = document.createElement("figcaption");
    caption.textContent = spec.title;
    this.box.appendChild(caption);
    this.plotBox = document.createElement("div");
    this.box.appendChild(this.plotBox);
    parent.appendChild(this.box);
    this.plot = null;
    this.labels = null;
  }

  width() { return Math.max(240, this.box.clientWidth - 12); }

  // xs: step starts (POSIX seconds); series: [[label, values (number|null)[]], ...]
  update(xs, series) {
    const labels = series.map(([label]) => String(label).slice(0, 64));
    const data = [xs, ...series.map(([, values]) => values.map((v) => (v === null || v === undefined ? null : Number(v))))];
    if (this.plot && this.labels.join("\u0000") === labels.join("\u0000")) {
      this.plot.setData(data);
      this.showLatest();
      return;
    }
    if (this.plot) this.plot.destroy();
    this.labels = labels;
    const unit = this.spec.unit;
    const opts = {
      width: this.width(),
      height: CHART_HEIGHT,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      series: [
        { label: "Time", value: (u, t) => chartTime(t) },
        ...labels.map((label, i) => ({
          label, stroke: CHART_COLOURS[i % CHART_COLOURS.length], width: 1.5,
          value: (u, v) => chartValue(v, unit),
          points: { size: 6, fill: CHART_COLOURS[i % CHART_COLOURS.length], filter: isolatedPoints },
        })),
      ],
      axes: [
        // one short line per tick (hh:mm, :ss between minutes): uPlot's own labels put the
        // date under a day's first tick ("12/3/26 10:22pm"), over its neighbours' on a
        // narrow chart
        { label: "Time (local)", stroke: "#333", space: 55, grid: { stroke: "#e6e6e6" }, ticks: { stroke: "#bbb" },
          values: (u, splits) => splits.map(timeTick) },
        { label: this.spec.axis, stroke: "#333", size: 56, grid: { stroke: "#e6e6e6" },
          ticks: { stroke: "#bbb" }, values: (u, splits) => splits.map((v) => `${+v.toPrecision(3)}`) },
      ],
      legend: { live: true },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      hooks: {
        setCursor: [(u) => { if (u.cursor.idx === null || u.cursor.idx === undefined) this.showLatest(); }],
      },
    };
    this.plot = new uPlot(opts, data, this.plotBox);
    // The legend's names carry the class the rest of the page and its tests look for.
    for (const node of this.plotBox.querySelectorAll(".u-legend .u-series:not(:first-child) .u-label")) {
      node.classList.add("series-name");
    }
    this.showLatest();
  }

  // Without a cursor on the chart the legend shows the newest step.
  showLatest() {
    const n = this.plot ? this.plot.data[0].length : 0;
    if (n) this.plot.setLegend({ idx: n - 1 });
  }

  resize() { if (this.plot) this.plot.setSize({ width: this.width(), height: CHART_HEIGHT }); }
}

// The charts of one container by id, made on first use.
class ChartGroup {
  constructor(container) { this.container = container; this.charts = new Map(); }

  chart(spec) {
    let chart = this.charts.get(spec.id);
    if (!chart) { chart = new TimeChart(this.container, spec); this.charts.set(spec.id, chart); }
    return chart;
  }

  resize() { for (const chart of this.charts.values()) chart.resize(); }
}

window.TimeChart = TimeChart;
window.ChartGroup = ChartGroup;
window.chartValue = chartValue;
