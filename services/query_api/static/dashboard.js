// kgstream operations dashboard: fetches v1/dashboard every refresh_s seconds and draws each
// chart with the vendored uPlot. Each chart's <section> carries data-points (values drawn, not
// null), so tests and operators can tell an empty chart from a flat one.
"use strict";
(function () {
  const KEY = "kgstream.apiKey";
  const COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#455a64"];
  const CHARTS = [
    { key: "throughput", title: "Ingest throughput", axis: "events/s",
      note: "events applied (changed the index) and handled (any outcome), per second, 1-minute buckets" },
    { key: "freshness", title: "Freshness", axis: "seconds",
      note: "commit time minus the event's occurred_at, and minus the Kafka record timestamp; p50/p99 per minute" },
    { key: "lag", title: "Indexer lag", axis: "records",
      note: "records on the topic not yet applied, per consumer group (broker end offsets)" },
    { key: "change_ratio", title: "Change ratio vs threshold", axis: "ratio",
      note: "graph change since the published snapshot; a recompute runs above the threshold" },
    { key: "snapshots", title: "Snapshot history", axis: "seconds", points: true, center: true,
      note: "recompute duration of each snapshot (start to publish), at its start time" },
    { key: "dead_letters", title: "Dead letters by reason", axis: "per minute",
      note: "events dead-lettered per minute, by reason" },
    { key: "query_latency", title: "Query latency by mode", axis: "seconds",
      note: "p50/p99 of this API process's answered queries over the preceding minute" },
    { key: "tokens", title: "LLM tokens", axis: "tokens/min",
      note: "prompt + completion tokens reported by the model endpoint, by purpose and model" },
  ];
  const plots = {};
  const $ = (id) => document.getElementById(id);
  let timer = null;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function panels() {
    const main = $("charts");
    for (const c of CHARTS) {
      const section = el("section", { class: "panel", id: "chart-" + c.key, "data-chart": c.key, "data-points": "0" });
      section.append(el("h2", {}, c.title), el("p", { class: "note" }, c.note));
      section.append(el("div", { class: "plot" }), el("div", { class: "empty" }, "no data yet"));
      main.append(section);
    }
  }

  function fmt(v, digits) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.01 || a >= 1e6)) return v.toExponential(2);
    return v.toFixed(digits === undefined ? (a >= 100 ? 0 : 2) : digits);
  }

  function seriesOpts(chart, spec) {
    return chart.series.map((s, i) => {
      const threshold = s.name === "threshold";
      return {
        label: s.name,
        stroke: threshold ? "#c62828" : COLORS[i % COLORS.length],
        width: threshold ? 2 : 1.75,
        dash: threshold ? [8, 5] : (/ p99/.test(s.name) ? [4, 3] : undefined),
        points: { show: threshold ? false : true, size: spec.points ? 9 : 4 },
        value: (u, v) => fmt(v),
        spanGaps: false,
      };
    });
  }

  // At least ten minutes of x axis: a sampler that has just started shows its points at the
  // right edge, a lone snapshot sits in the middle; a little room on the right for the last point.
  function xRange(spec, u, min, max) {
    const xs = u.data[0];
    if (xs && xs.length) { min = xs[0]; max = xs[xs.length - 1]; }
    if (min === null || max === null) return [min, max];
    const span = max - min;
    if (span < 600) return spec.center ? [min - 300, max + 300] : [max - 600, max + 15];
    return [min, max + span * 0.02];
  }

  // The threshold across the whole plot (its series only spans the samples taken so far).
  function thresholdLine(u, chart) {
    const i = chart.series.findIndex((s) => s.name === "threshold");
    const values = i < 0 ? [] : u.data[i + 1];
    if (!values || !values.length) return;
    const y = Math.round(u.valToPos(values[values.length - 1], "y", true));
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#c62828";
    ctx.lineWidth = 2;
    ctx.setLineDash([8, 5]);
    ctx.beginPath();
    ctx.moveTo(u.bbox.left, y);
    ctx.lineTo(u.bbox.left + u.bbox.width, y);
    ctx.stroke();
    ctx.restore();
  }

  function draw(spec, chart) {
    const section = $("chart-" + spec.key);
    const box = section.querySelector(".plot");
    const data = [chart.t, ...chart.series.map((s) => s.values)];
    const names = chart.series.map((s) => s.name).join("\u0000");
    let plot = plots[spec.key];
    if (plot && plot.names === names) {
      plot.u.setData(data);
    } else {
      if (plot) plot.u.destroy();
      const width = Math.max(320, box.clientWidth || section.clientWidth - 28);
      const opts = {
        width: width, height: 230,
        scales: { x: { time: true, range: (u, min, max) => xRange(spec, u, min, max) }, y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1] } },
        axes: [{}, { label: spec.axis, size: 60, values: (u, ticks) => ticks.map((v) => fmt(v)) }],
        series: [{ label: "time" }, ...seriesOpts(chart, spec)],
        legend: { live: false },
        hooks: { draw: [(u) => thresholdLine(u, chart)] },
      };
      plot = { u: new uPlot(opts, data, box), names: names };
      plots[spec.key] = plot;
    }
    let count = 0;
    for (let i = 1; i < plot.u.data.length; i++) {
      for (const v of plot.u.data[i]) if (v !== null && v !== undefined) count++;
    }
    section.setAttribute("data-points", String(chart.t.length ? count : 0));
  }

  function last(chart, name) {
    const s = chart && chart.series.find((x) => x.name === name);
    if (!s) return null;
    for (let i = s.values.length - 1; i >= 0; i--) if (s.values[i] !== null) return s.values[i];
    return null;
  }

  function lastOfAll(chart) {
    let total = null;
    for (const s of (chart ? chart.series : [])) {
      const v = last(chart, s.name);
      if (v !== null) total = (total || 0) + v;
    }
    return total;
  }

  function tiles(data) {
    const c = data.charts;
    const ratio = last(c.change_ratio, "change ratio");
    const items = [
      ["applied / s (this minute)", fmt(last(c.throughput, "applied")), false],
      ["freshness p99 (since published)", fmt(last(c.freshness, "p99 since published")) + " s", false],
      ["indexer lag (records waiting)", fmt(lastOfAll(c.lag), 0), (lastOfAll(c.lag) || 0) > 0],
      ["change ratio / threshold", fmt(ratio, 3) + " / " + fmt(data.threshold, 2), ratio !== null && ratio > data.threshold],
      ["snapshots kept", String(c.snapshots.rows.length), c.snapshots.rows.some((r) => r.status === "failed")],
    ];
    const box = $("tiles");
    box.replaceChildren();
    for (const [label, value, warn] of items) {
      const tile = el("div", { class: "tile" + (warn ? " warn" : "") });
      tile.append(el("div", { class: "label" }, label), el("div", { class: "value" }, value));
      box.append(tile);
    }
  }

  function snapshotTable(rows) {
    const box = $("snapshot-table");
    box.replaceChildren(el("h2", {}, "Snapshots (newest first)"));
    const table = el("table");
    const head = el("tr");
    for (const h of ["id", "status", "started", "published", "recompute", "nodes", "edges", "communities", "levels"]) head.append(el("th", {}, h));
    table.append(head);
    for (const r of rows.slice().reverse()) {
      const tr = el("tr");
      const cells = [r.id, r.status, new Date(r.created_at).toLocaleString(),
        r.published_at ? new Date(r.published_at).toLocaleString() : "–",
        r.recompute_s === null ? "–" : fmt(r.recompute_s) + " s", r.nodes, r.edges, r.communities, r.levels];
      cells.forEach((v, i) => tr.append(el("td", i === 1 ? { class: "status-" + r.status } : {}, String(v))));
      table.append(tr);
    }
    if (!rows.length) {
      const tr = el("tr");
      tr.append(el("td", { colspan: "9" }, "no snapshot yet"));
      table.append(tr);
    }
    box.append(table);
  }

  function setState(state, message) {
    document.body.setAttribute("data-state", state);
    $("status").textContent = message;
  }

  function askForKey(reason) {
    sessionStorage.removeItem(KEY);
    $("key-reason").textContent = reason;
    $("key-form").hidden = false;
    setState("auth", "waiting for an API key");
  }

  function schedule(seconds) {
    clearTimeout(timer);
    timer = setTimeout(refresh, Math.max(1, seconds) * 1000);
  }

  async function refresh() {
    const key = sessionStorage.getItem(KEY);
    const headers = { Accept: "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    let resp;
    try {
      resp = await fetch("v1/dashboard", { headers: headers, cache: "no-store" });
    } catch (err) {
      setState("error", "cannot reach the API: " + err);
      return schedule(5);
    }
    if (resp.status === 401) {
      return askForKey(key ? "That API key was refused (unknown, revoked or malformed): enter another."
        : "The dashboard's data needs an API key with the admin scope (kgstream keys create --scopes admin).");
    }
    if (resp.status === 403) return askForKey("That API key lacks the admin scope: enter a key that has it.");
    if (!resp.ok) {
      setState("error", "v1/dashboard answered " + resp.status);
      return schedule(5);
    }
    const data = await resp.json();
    $("key-form").hidden = true;
    for (const spec of CHARTS) draw(spec, data.charts[spec.key]);
    tiles(data);
    snapshotTable(data.charts.snapshots.rows);
    const at = new Date(data.now * 1000).toLocaleTimeString();
    setState("ready", "updated " + at + " · refreshes every " + data.refresh_s + " s · window " + Math.round(data.window_s / 60) + " min");
    schedule(data.refresh_s);
  }

  document.addEventListener("DOMContentLoaded", () => {
    panels();
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, $("key-input").value.trim());
      $("key-input").value = "";
      $("key-form").hidden = true;
      refresh();
    });
    refresh();
  });
})();
