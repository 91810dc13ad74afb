// Numbers shown to a person: the per-reply badge and the cache panel's figures parsed from GET /metrics.

const NUMBER = new Intl.NumberFormat("en-US");

/** The compact form of a reply's figures, as kept per message: {p, c, k, ttft, tps, fr}. */
export function compactStats(usage, timings, finishReason) {
  return {
    p: usage?.prompt_tokens ?? 0, // prompt tokens
    c: usage?.completion_tokens ?? 0, // completion tokens
    k: usage?.prompt_tokens_details?.cached_tokens ?? 0, // cached prompt tokens
    ttft: timings?.ttft_ms ?? null, // ms to the first token, null when none was generated
    tps: timings?.decode_tokens_per_s ?? 0, // decode speed
    fr: finishReason ?? null, // why the reply ended
  };
}

/** "1,932 of 2,010 prompt tokens cached · first token 0.21 s · 24 tok/s", then " · stopped" or " · cut at max tokens"
 * when the reply ended early. */
export function badgeText(s) {
  const parts = [`${NUMBER.format(s.k)} of ${NUMBER.format(s.p)} prompt tokens cached`];
  if (s.ttft !== null && s.ttft !== undefined) parts.push(`first token ${(s.ttft / 1000).toFixed(2)} s`);
  if (s.tps > 0) parts.push(`${s.tps >= 10 ? Math.round(s.tps) : s.tps.toFixed(1)} tok/s`);
  if (s.fr === "cancelled") parts.push("stopped");
  if (s.fr === "length") parts.push("cut at max tokens");
  return parts.join(" · ");
}

/**
 * The samples of a Prometheus text exposition: {name: [{labels: {k: v}, value}]}. Only what the cache panel
 * needs is read; comments and malformed lines are skipped.
 */
export function parsePrometheus(text) {
  const out = {};
  const line = /^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)/;
  for (const raw of String(text).split("\n")) {
    if (!raw || raw.startsWith("#")) continue;
    const m = line.exec(raw);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    const value = Number(m[3] === "+Inf" ? Infinity : m[3]);
    (out[m[1]] ||= []).push({ labels, value });
  }
  return out;
}

/** The cache panel's figures from GET /metrics text. */
export function cacheFigures(text) {
  const s = parsePrometheus(text);
  const one = (name) => s[name]?.[0]?.value ?? null;
  const perTier = (name) => Object.fromEntries((s[name] || []).map((x) => [x.labels.tier ?? "", x.value]));
  return {
    entries: perTier("turncache_cache_entries"), // tier -> entries
    bytes: perTier("turncache_cache_bytes"), // tier -> bytes
    hitRatio: one("turncache_cache_hit_ratio"), // cached / prompt tokens over finished turns
    turns: one("turncache_turns_total"),
    promptTokens: one("turncache_prompt_tokens_total"),
    cachedTokens: one("turncache_cached_tokens_total"),
    lookups: one("turncache_cache_lookups_total"),
    hits: one("turncache_cache_hits_total"),
    evictions: one("turncache_cache_evictions_total"),
    offloads: one("turncache_cache_offloads_total"),
    cacheEnabled: "turncache_cache_entries" in s,
  };
}

export function formatNumber(n) {
  return NUMBER.format(n);
}
