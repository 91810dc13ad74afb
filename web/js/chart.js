// The cache panel's chart: one bar per turn (prompt tokens; the cached part filled) and the hit ratio
// (cached / prompt) as a line on a 0-100 % scale. Inline SVG built node by node.

const SVG = "http://www.w3.org/2000/svg";
const W = 280; // viewBox width
const H = 120; // viewBox height
const PAD = { left: 4, right: 30, top: 8, bottom: 14 };
const MAX_TURNS = 24; // the most recent turns shown
const MIN_SLOTS = 8; // bars are never wider than 1/8 of the plot

function el(doc, name, attrs = {}) {
  const node = doc.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

/** An <svg> for `series` = [{p: prompt tokens, k: cached tokens}], oldest first. */
export function cacheChart(series, doc = document) {
  const data = series.slice(-MAX_TURNS);
  const svg = el(doc, "svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
  const last = data[data.length - 1];
  const title = el(doc, "title");
  title.textContent = last
    ? `Cached prompt tokens per turn; last turn ${Math.round((100 * last.k) / Math.max(last.p, 1))} % cached`
    : "No turns yet";
  svg.append(title);
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const y = (frac) => PAD.top + plotH * (1 - frac);
  for (const frac of [0, 0.5, 1]) {
    svg.append(el(doc, "line", { x1: PAD.left, x2: PAD.left + plotW, y1: y(frac), y2: y(frac), class: "grid" }));
    const label = el(doc, "text", { x: W - 2, y: y(frac) + 3, class: "axis", "text-anchor": "end" });
    label.textContent = `${frac * 100}%`;
    svg.append(label);
  }
  if (!data.length) {
    const empty = el(doc, "text", { x: PAD.left + plotW / 2, y: H / 2, class: "axis", "text-anchor": "middle" });
    empty.textContent = "no turns yet";
    svg.append(empty);
    return svg;
  }
  const maxP = Math.max(...data.map((d) => d.p), 1);
  const slot = plotW / Math.max(data.length, MIN_SLOTS);
  const barW = Math.max(slot * 0.7, 2);
  const points = [];
  data.forEach((d, i) => {
    const x = PAD.left + i * slot + (slot - barW) / 2;
    const h = (plotH * d.p) / maxP;
    const hk = (plotH * Math.min(d.k, d.p)) / maxP;
    svg.append(el(doc, "rect", { x, y: PAD.top + plotH - h, width: barW, height: h, class: "bar-prompt" }));
    svg.append(el(doc, "rect", { x, y: PAD.top + plotH - hk, width: barW, height: hk, class: "bar-cached" }));
    points.push([x + barW / 2, y(d.p ? d.k / d.p : 0)]);
  });
  svg.append(el(doc, "polyline", { points: points.map((p) => p.map((v) => v.toFixed(1)).join(",")).join(" "),
    class: "ratio-line" }));
  for (const [cx, cy] of points) svg.append(el(doc, "circle", { cx, cy, r: 2.2, class: "ratio-dot" }));
  const caption = el(doc, "text", { x: PAD.left, y: H - 2, class: "axis" });
  caption.textContent = `last ${data.length} turn${data.length === 1 ? "" : "s"} · bars: prompt tokens (max ${maxP})`;
  svg.append(caption);
  return svg;
}
