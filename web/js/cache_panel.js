// The cache side panel: the server's prefix cache figures (GET /metrics, Prometheus text) and this chat's
// per-turn chart.

import { cacheChart } from "./chart.js";
import { formatBytes } from "./media.js";
import { cacheFigures, formatNumber } from "./stats.js";

export class CachePanel {
  constructor({ figures, error, chart }, headers = () => ({})) {
    this.figuresEl = figures; // <dl> of figures
    this.errorEl = error; // shown when /metrics cannot be read
    this.chartEl = chart; // holds the <svg>
    this.headers = headers; // () => extra request headers (the access token)
    this.busy = false; // a request is in flight
  }

  /** Fetch /metrics and show it. Skipped while the page is hidden or a request is in flight. */
  async refresh() {
    if (this.busy || document.visibilityState !== "visible") return;
    this.busy = true;
    try {
      const res = await fetch("/metrics", { cache: "no-store", headers: this.headers() });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      this.showFigures(cacheFigures(await res.text()));
      this.errorEl.hidden = true;
    } catch (err) {
      this.errorEl.textContent = `Cache figures are unavailable (${err.message}).`;
      this.errorEl.hidden = false;
    } finally {
      this.busy = false;
    }
  }

  /** Draw the chart of `series` = [{p, k}] (prompt and cached tokens per turn). */
  showSeries(series) {
    this.chartEl.replaceChildren(cacheChart(series));
  }

  showFigures(f) {
    const tiers = (map, fmt) =>
      Object.entries(map)
        .map(([t, v]) => `${t} ${fmt(v)}`)
        .join(" · ") || "—";
    const rows = f.cacheEnabled
      ? [["Entries", tiers(f.entries, formatNumber)], ["Memory", tiers(f.bytes, formatBytes)]]
      : [["Cache", "off on this server"]];
    if (f.hitRatio !== null) rows.push(["Hit rate", `${(100 * f.hitRatio).toFixed(1)} % of prompt tokens`]);
    if (f.lookups !== null) rows.push(["Lookups", `${formatNumber(f.lookups)} (${formatNumber(f.hits ?? 0)} hits)`]);
    if (f.turns !== null) rows.push(["Turns", formatNumber(f.turns)]);
    if (f.evictions !== null) {
      rows.push(["Evicted · offloaded", `${formatNumber(f.evictions)} · ${formatNumber(f.offloads ?? 0)}`]);
    }
    this.figuresEl.replaceChildren(
      ...rows.flatMap(([k, v]) => {
        const dt = document.createElement("dt");
        dt.textContent = k;
        const dd = document.createElement("dd");
        dd.textContent = v;
        return [dt, dd];
      }),
    );
  }
}
