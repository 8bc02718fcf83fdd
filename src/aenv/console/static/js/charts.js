// Line charts (uPlot, installed by `make setup`): made once per id, then given new data.
import { h } from "./ui.js";

let lib;

// uPlot, or null when its library is not installed on the node.
export async function uPlot() {
  if (lib === undefined) {
    try {
      lib = (await import("/vendor/uplot/dist/uPlot.esm.js")).default;
    } catch {
      lib = null;
    }
  }
  return lib;
}

export const NO_CHARTS = "No charts: their library is not installed on the node (make setup).";

// Draws `series` ({key, label, color}) of `rows` (each with `t`, unix seconds) into the
// chart `id` of `box`, kept in `plots` (a Map) between calls.
export function lineChart(UPlot, box, plots, id, title, series, rows) {
  const data = [rows.map((p) => p.t), ...series.map((s) => rows.map((p) => p[s.key]))];
  const width = Math.max(280, Math.min(box.clientWidth || 600, 900));
  let plot = plots.get(id);
  if (plot) {
    plot.setData(data);
    if (plot.width !== width) plot.setSize({ width, height: 200 });
    return;
  }
  const figure = h("figure", { id, class: "chart" }, h("figcaption", {}, title));
  box.append(figure);
  plot = new UPlot({
    width, height: 200,
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2 }))],
    axes: [{}, { size: 60 }],
  }, data, figure);
  plots.set(id, plot);
}
