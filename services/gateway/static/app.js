// timeshare dashboard: vanilla JS over the gateway's JSON API (no framework, nothing from a CDN).
// Every value reaches the page through textContent / attributes, never innerHTML: workload
// ids, projects and users are user input.
"use strict";

const REFRESH_MS = 10000;
const TOKEN_KEY = "timeshare.token";

// -- small helpers ------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.setAttribute("style", v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k in e) e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
// the same for SVG elements (the chart): attributes only, text through text nodes
function svg(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
const num = (x, digits = 2) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(digits);
// a ratio early in a window is tiny (minutes of use in a 7-day window): "<0.01×", not 0.000028×
const ratioText = (x) => (x === null || x === undefined) ? "–" : x > 0 && x < 0.01 ? "<0.01×" : `${num(x)}×`;
const pct = (x) => (x === null || x === undefined) ? "–" : `${(100 * x).toFixed(1)}%`;
function dur(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.round(s));
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
  if (d) return `${d}d${String(h).padStart(2, "0")}h`;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m${String(sec).padStart(2, "0")}s`;
  return `${sec}s`;
}
// UTC, like the CLI: people in several time zones read the same page
function utc(ms) {
  if (ms === null || ms === undefined) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function token() { return localStorage.getItem(TOKEN_KEY) || ""; }

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${token()}` } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail || detail; } catch (_) { /* not JSON */ }
    const err = new Error(`${r.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

// -- team colours: a hue per program (the tree's first level), a shade per team within it ----
const HUES = [[215, 70], [28, 85], [135, 50], [275, 45], [0, 70], [0, 0]];  // blue orange green purple red grey
function teamColours(paths) {
  const leaves = [...paths].sort();
  const programs = [...new Set(leaves.map((p) => p.split("/")[0]))].sort();
  const out = {};
  for (const [pi, prog] of programs.entries()) {
    const [hue, sat] = HUES[pi % HUES.length];
    const teams = leaves.filter((p) => p === prog || p.startsWith(prog + "/"));
    teams.forEach((t, i) => {
      // dark to light inside a program, and the hue turned a little each step: two neighbours
      // told apart by lightness alone looked alike (two oranges)
      const step = teams.length === 1 ? 0 : i / (teams.length - 1);
      const light = teams.length === 1 ? 45 : 28 + 40 * step;
      const turn = teams.length === 1 ? 0 : (step - 0.5) * Math.min(40, 14 * (teams.length - 1));
      out[t] = `hsl(${((hue + turn) + 360) % 360} ${sat}% ${light.toFixed(0)}%)`;
    });
    out[prog] = out[prog] || `hsl(${hue} ${sat}% 45%)`;
  }
  return out;
}
// the text on a team's colour: black or white, whichever contrasts more (WCAG's relative
// luminance; either way at least 4.5:1 against the plain colour)
function inkOf(colour) {
  const m = /hsl\(([\d.]+) ([\d.]+)% ([\d.]+)%\)/.exec(colour);
  if (!m) return "ink-light";
  const [h, sat, l] = [Number(m[1]), Number(m[2]) / 100, Number(m[3]) / 100];
  const a = sat * Math.min(l, 1 - l);
  const channel = (n) => { const k = (n + h / 30) % 12; return l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)); };
  const lin = (c) => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  const lum = 0.2126 * lin(channel(0)) + 0.7152 * lin(channel(8)) + 0.0722 * lin(channel(4));
  return (lum + 0.05) / 0.05 > 1.05 / (lum + 0.05) ? "ink-dark" : "ink-light";
}
function colourOf(colours, path) {
  if (colours[path]) return colours[path];
  const parts = path.split("/");  // a deeper path than the leaves we know: its nearest ancestor
  while (parts.length) { parts.pop(); if (colours[parts.join("/")]) return colours[parts.join("/")]; }
  return "#98a2b3";
}
const swatch = (colour) => el("span", { class: "swatch", style: `background:${colour}` });

// -- pages ---------------------------------------------------------------------------------
const RANGES = { "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "all": null };

// what the range's preemptions wasted (the simulator's figures): lost progress + GPU time
// writing checkpoints on notice (+ run time of failed work)
function wasteFact(report) {
  const w = report.waste || {};
  return el("div", { id: "waste", title: `${num(w.per_1000_delivered_gpu_hours, 1)} per 1,000 GPU-h delivered` },
    el("b", {}, num(report.wasted_gpu_hours, 2)),
    `wasted GPU-h (lost progress ${num(w.lost_gpu_hours, 2)}, checkpoints on notice ${num(w.checkpoint_gpu_hours, 2)})`);
}

async function renderTree(main) {
  // default: since the first event (a range reaching before it would count idle hours the
  // cluster did not exist); the ledger refuses a journal over 400 days: then the last 7 days
  let range = new URLSearchParams(location.search).get("range") || "all";
  if (!(range in RANGES)) range = "all";
  const tree = await api("/v1/allocations");
  let report = null, reportError = null, fromS = null;
  for (const r of [range, "7d"]) {
    fromS = RANGES[r] ? Math.max(0, tree.now_s - RANGES[r]) : null;
    try {
      report = await api(`/v1/report${fromS !== null ? `?from_s=${fromS}` : ""}`);
      range = r;
      break;
    } catch (e) { reportError = e.message; if (e.status !== 400 || r === "7d") break; }
  }
  // the chart's tree node ("" = every team), from the address like the range
  let chartNode = new URLSearchParams(location.search).get("node") || "";
  if (chartNode && !(chartNode in tree.nodes)) chartNode = "";
  const q = new URLSearchParams({ node: chartNode });
  if (fromS !== null) q.set("from_s", fromS);
  let series = null, seriesError = null;
  try { series = await api(`/v1/report/series?${q}`); } catch (e) { seriesError = e.message; }
  const nodes = tree.nodes;
  const paths = Object.keys(nodes);
  const leaves = paths.filter((p) => !nodes[p].children.length);
  const colours = teamColours(leaves);
  // owed / delivered of an inner node: the sum of its teams'
  const teams = (report && report.teams) || {};
  const sums = {};
  for (const p of paths) {
    const under = leaves.filter((l) => l === p || l.startsWith(p + "/"));
    sums[p] = under.reduce((a, l) => ({ owed: a.owed + (teams[l] ? teams[l].owed_gpu_hours : 0),
                                        delivered: a.delivered + (teams[l] ? teams[l].delivered_gpu_hours : 0) }),
                           { owed: 0, delivered: 0 });
  }
  const maxH = Math.max(1e-9, ...paths.map((p) => Math.max(sums[p].owed, sums[p].delivered)));
  const rangeSel = el("select", { id: "range", "aria-label": "report range" },
    Object.keys(RANGES).map((r) => el("option", { value: r, selected: r === range }, r === "all" ? "since the first event" : `last ${r}`)));
  const go = (r, n) => { location.search = `?${new URLSearchParams(n ? { range: r, node: n } : { range: r })}`; };
  rangeSel.addEventListener("change", () => go(rangeSel.value, chartNode));
  const nodeSel = el("select", { id: "chart-node", "aria-label": "tree node of the chart" },
    el("option", { value: "", selected: chartNode === "" }, "every team"),
    Object.keys(tree.nodes).sort().map((p) => el("option", { value: p, selected: p === chartNode }, p)));
  nodeSel.addEventListener("change", () => go(range, nodeSel.value));
  const rows = [];
  const walk = (p, depth) => {
    const n = nodes[p];
    const usage = Object.values(n.usage);
    const ratio = usage.length === 1 ? usage[0].ratio : null;
    const running = usage.reduce((a, u) => a + u.running_gpus, 0);
    const s = sums[p];
    const att = s.owed > 0 ? Math.min(s.delivered, s.owed) / s.owed : null;
    const leafAtt = teams[p] ? teams[p].attainment : att;
    rows.push(el("tr", { "data-path": p },
      el("td", { style: `padding-left:${10 + depth * 18}px` }, swatch(colourOf(colours, p)), p.split("/").pop()),
      el("td", { class: "num" }, num(n.share, 2)),
      el("td", { class: "num" }, pct(n.fraction)),
      el("td", { class: "num" }, running),
      el("td", { class: "num", title: "allocated GPU-s used in the window / the share's GPU-s" }, ratioText(ratio)),
      el("td", { class: "num" }, num(s.owed, 1)),
      el("td", { class: "num" }, num(s.delivered, 1)),
      el("td", { class: "num" }, leafAtt === null || leafAtt === undefined ? "–" : pct(leafAtt)),
      el("td", {}, el("span", { class: "bar", title: `delivered ${num(s.delivered, 1)} of ${num(s.owed, 1)} GPU-h owed` },
        el("span", { class: "delivered", style: `width:${(100 * s.delivered / maxH).toFixed(1)}%;background:${colourOf(colours, p)}` }),
        el("span", { class: "owed", style: `width:${(100 * s.owed / maxH).toFixed(1)}%` })))));
    for (const c of [...n.children].sort()) walk(c, depth + 1);
  };
  for (const p of paths.filter((p) => !nodes[p].parent).sort()) walk(p, 0);
  main.replaceChildren(
    el("h1", {}, "Allocation tree"),
    el("p", { class: "muted" }, `Shares split down the tree; fraction = the product of share / siblings' shares down the path. `,
      `Usage ratio over the ${dur(tree.window_s)} window (1.00× = used exactly its share). Owed and delivered GPU-hours of funded work `,
      `(minimum runtime > 0 on a budget) over `, rangeSel, "."),
    report ? el("div", { class: "facts", id: "fleet" },
      el("div", {}, el("b", {}, pct(report.attainment && report.attainment.fleet)), "funded attainment (fleet)"),
      el("div", {}, el("b", {}, pct(report.occupancy)), "occupancy"),
      el("div", {}, el("b", {}, pct(report.unallocated_share)), "unallocated share"),
      el("div", {}, el("b", {}, report.preemptions ?? "–"), "preemptions"),
      wasteFact(report)) : el("p", { class: "error" }, `report: ${reportError}`),
    el("table", { id: "tree" },
      el("thead", {}, el("tr", {}, ["node", "share", "fraction", "GPUs now", "usage ratio", "owed GPU-h", "delivered GPU-h",
        "attainment", "delivered (fill) vs owed (line)"].map((h, i) => el("th", { class: i && i < 8 ? "num" : "" }, h)))),
      el("tbody", {}, rows)),
    el("h2", {}, "Delivered vs owed over time"),
    el("p", { class: "muted" }, `GPU-hours of funded work of `, nodeSel, ` per ${series ? bucketText(series.bucket_s) : "hour"} over the range above: `,
      `delivered (bars), owed (black line: its share, capped by what its teams asked for), its share of the GPUs (dashed). `,
      `The hour in progress counts the minutes so far.`),
    series ? seriesChart(series, chartNode ? colourOf(colours, chartNode) : "#2f5fb3")
      : el("p", { class: "error", id: "series-error" }, `series: ${seriesError}`));
}

const bucketText = (s) => s === 3600 ? "hour" : s === 86400 ? "day" : s % 86400 ? `${s / 3600} hours` : `${s / 86400} days`;

// delivered vs owed per bucket as an inline SVG bar chart: no charting library (a dozen shapes
// per bucket at most; nothing to vendor, and every label goes in as text)
function seriesChart(series, colour) {
  const b = series.buckets;
  if (!b.length) return el("p", { class: "muted", id: "series" }, "No hours with data in this range yet.");
  const W = 860, H = 260, L = 74, R = 14, T = 12, B = 42;
  const top = Math.max(1e-6, ...b.map((x) => Math.max(x.delivered_gpu_hours, x.owed_gpu_hours, x.entitled_gpu_hours)));
  // a round axis maximum: 1, 2 or 5 times a power of ten
  const p10 = 10 ** Math.floor(Math.log10(top));
  const yMax = [1, 2, 5, 10].map((m) => m * p10).find((v) => v >= top);
  const slot = (W - L - R) / b.length, barW = Math.max(1, Math.min(60, slot * 0.7));
  const x = (i) => L + i * slot + (slot - barW) / 2;
  const y = (v) => T + (H - T - B) * (1 - v / yMax);
  const parts = [];
  // five steps of 0.2, 0.4 or 1 x a power of ten, with the decimals a step needs (minutes
  // into a demo: thousandths of a GPU-hour)
  const decimals = Math.min(6, Math.max(0, -Math.floor(Math.log10(yMax / 5) + 1e-9)));
  for (let k = 0; k <= 5; k++) {  // horizontal grid and y ticks
    const v = (yMax * k) / 5;
    parts.push(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, k ? num(v, decimals) : "0"));
  }
  const every = Math.ceil(b.length / 8);  // at most 8 time labels
  b.forEach((d, i) => {
    const tip = `${utc(d.from_s * 1000)} – ${utc(d.to_s * 1000)}: delivered ${num(d.delivered_gpu_hours, 2)}, owed ${num(d.owed_gpu_hours, 2)}, share ${num(d.entitled_gpu_hours, 2)} GPU-h`;
    parts.push(svg("rect", { class: "delivered", "data-bucket": d.from_s, x: x(i), width: barW, y: y(d.delivered_gpu_hours),
      height: Math.max(0, y(0) - y(d.delivered_gpu_hours)), fill: colour }, svg("title", {}, tip)));
    parts.push(svg("line", { class: "owed", x1: x(i) - 2, x2: x(i) + barW + 2, y1: y(d.owed_gpu_hours), y2: y(d.owed_gpu_hours) }, svg("title", {}, tip)));
    parts.push(svg("line", { class: "entitled", x1: L + i * slot, x2: L + (i + 1) * slot, y1: y(d.entitled_gpu_hours), y2: y(d.entitled_gpu_hours) }));
    if (i % every === 0) {
      const t = utc(d.from_s * 1000);
      parts.push(svg("text", { x: L + i * slot + slot / 2, y: H - B + 16, "text-anchor": "middle", class: "tick" },
        series.bucket_s < 86400 ? t.slice(11, 16) : t.slice(0, 10)));
    }
  });
  const first = utc(b[0].from_s * 1000).slice(0, 10), last = utc(b[b.length - 1].to_s * 1000).slice(0, 10);
  return el("div", { id: "series", "data-points": b.length },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": "delivered vs owed GPU-hours over time" },
      parts,
      svg("line", { x1: L, x2: W - R, y1: y(0), y2: y(0), class: "axis" }),
      svg("line", { x1: L, x2: L, y1: T, y2: y(0), class: "axis" }),
      svg("text", { class: "axis-label", id: "y-label", transform: `translate(14 ${(T + H - B) / 2}) rotate(-90)`, "text-anchor": "middle" },
        `GPU-hours per ${bucketText(series.bucket_s)}`),
      svg("text", { class: "axis-label", id: "x-label", x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" },
        `time (UTC) ${first === last ? first : `${first} to ${last}`}`)),
    el("div", { class: "legend" },
      el("span", {}, swatch(colour), "delivered"),
      el("span", {}, el("span", { class: "key-owed" }), "owed"),
      el("span", {}, el("span", { class: "key-entitled" }), "share of the GPUs")));
}

function keyText(levels) {
  // the ordering key, level by level from the top: fill = running / due GPUs now, then the ratio
  return levels.filter((k) => typeof k === "object" && k !== null && "subtree" in k)
    .map((k) => `${k.subtree}: fill ${num(k.fill)} (${k.running_gpus}/${num(k.due_gpus, 1)}) ratio ${ratioText(k.ratio)}`)
    .join("  ›  ");
}

// p90 of a histogram point: the upper bound of the bucket where 90% of the count is reached
// (an upper estimate; the last bucket has no bound: its lower one, with ">")
function p90(point) {
  const want = 0.9 * point.count;
  let seen = 0;
  for (const [i, n] of point.buckets.entries()) {
    seen += n;
    if (seen >= want) return i < point.bounds.length ? `≤ ${dur(point.bounds[i])}` : `> ${dur(point.bounds[point.bounds.length - 1])}`;
  }
  return "–";
}

function waitsTable(metrics) {
  const m = metrics && metrics["timeshare.queue.wait"];
  if (!m || !m.points.length) return null;
  const rows = m.points.map((p) => el("tr", { "data-kind": p.attributes.kind },
    el("td", {}, p.attributes.kind), el("td", {}, p.attributes.allocated ? "allocated" : "unallocated"),
    el("td", { class: "num" }, p.count), el("td", { class: "num" }, dur(p.sum / p.count)), el("td", { class: "num" }, p90(p)),
    el("td", { class: "num" }, dur(p.max))));
  return el("div", {},
    el("h2", {}, "Queue waits by kind"),
    el("p", { class: "muted" }, "Submission or requeue to start, every start since placement began (OpenTelemetry histogram timeshare.queue.wait)."),
    el("table", { id: "waits" },
      el("thead", {}, el("tr", {}, ["kind", "time", "starts", "mean", "p90", "max"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

async function renderQueue(main) {
  const [q, tree, metrics] = await Promise.all([api("/v1/queue?limit=500"), api("/v1/allocations"),
    api("/v1/metrics").then((b) => b.metrics).catch(() => null)]);
  const colours = teamColours(Object.keys(tree.nodes).filter((p) => !tree.nodes[p].children.length));
  const rows = q.workloads.map((w) => el("tr", { "data-workload": w.workload_id },
    el("td", { class: "num" }, w.position),
    el("td", {}, el("a", { href: `/ui/workloads/${encodeURIComponent(w.workload_id)}` }, w.workload_id)),
    el("td", {}, swatch(colourOf(colours, w.project)), w.project),
    el("td", {}, w.user),
    el("td", { class: "num" }, `${w.gpus} ${w.gpu_type}`),
    el("td", {}, w.phase),
    el("td", {}, w.priority),
    el("td", { class: "num" }, dur(q.now_s - w.queued_since_s)),
    el("td", { class: "key" }, keyText(w.ordering_key))));
  main.replaceChildren(
    el("h1", {}, "Queue"),
    el("p", { class: "muted" }, `${q.pending} pending, in the order the next scheduling pass takes them: allocated requests of teams `,
      `ranked by fill (allocated GPUs running / GPUs due now) at every level of the tree, then the usage ratio; inside a team `,
      `by priority and submit time; then unallocated requests.`),
    rows.length ? el("table", { id: "queue" },
      el("thead", {}, el("tr", {}, ["#", "workload", "project", "user", "GPUs", "phase", "priority", "waiting", "ordering key (per level)"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)) : el("p", { id: "queue-empty" }, "Nothing is waiting."),
    waitsTable(metrics));
}

async function renderCluster(main) {
  const [c, tree] = await Promise.all([api("/v1/cluster"), api("/v1/allocations")]);
  const colours = teamColours(Object.keys(tree.nodes).filter((p) => !tree.nodes[p].children.length));
  const used = new Set();
  const rows = c.nodes.map((n) => el("div", { class: "node-row", "data-node": n.name, "data-state": n.state },
    el("div", { class: "node-name" }, `${n.name}`, el("br"), el("span", { class: "muted" }, `${n.gpu_type} · ${n.state}`)),
    // the GPUs share the row's width; a cell shows its GPU, the team and the workload's id's end
    // (the whole id and the rest are in its title and one click away)
    el("div", { class: "gpus", style: `--gpus:${n.gpus.length}` }, n.gpus.map((g) => {
      if (!g.workload_id && g.held_for) return el("div", { class: "gpu free held", "data-gpu": g.gpu, "data-held-for": g.held_for,
        title: `${n.name} GPU ${g.gpu}: held for ${g.held_for} (it starts when its victims under notice have checkpointed)` },
        el("span", { class: "gpu-label" }, `${g.gpu} held`), el("span", { class: "gpu-label" }, `…${g.held_for.slice(-6)}`));
      if (!g.workload_id) return el("div", { class: "gpu free", "data-gpu": g.gpu, title: `${n.name} GPU ${g.gpu}: free` }, `${g.gpu}`);
      used.add(g.project);
      // under notice: preempted, checkpointing, its GPUs held for the preemptor until the deadline
      const mode = g.notice ? "notice" : g.protected ? "protected" : "preemptible";
      const why = g.notice
        ? `under notice since ${utc(g.notice.at_ms)}: ${g.notice.checkpointed_ms ? "checkpointed" : "checkpointing"}, `
          + `GPUs free by ${utc(g.notice.deadline_ms)} at the latest, for ${g.notice.by_workload_id || "a preemptor"}`
        : !g.allocated ? "unallocated: preemptible" : g.protected ? `protected until ${utc(g.protected_until_ms)}` : "past its minimum runtime: preemptible";
      const colour = colourOf(colours, g.project);
      return el("a", { class: `gpu ${mode} ${inkOf(colour)}`, href: `/ui/workloads/${encodeURIComponent(g.workload_id)}`, "data-gpu": g.gpu,
                       "data-workload": g.workload_id, "data-project": g.project, style: `background-color:${colour}`,
                       ...(g.notice ? { "data-notice-deadline": g.notice.deadline_ms, "data-held-for": g.notice.by_workload_id || "" } : {}),
                       title: `${n.name} GPU ${g.gpu}: ${g.workload_id} (${g.project}, ${g.user}) ${why}` },
        el("span", { class: "gpu-label" }, `${g.gpu} ${g.project.split("/").pop()}`),
        el("span", { class: "gpu-label" }, g.notice ? `notice ${utc(g.notice.deadline_ms).slice(11, 19)}` : `…${g.workload_id.slice(-6)}`));
    }))));
  const busy = c.nodes.reduce((a, n) => a + n.gpus.filter((g) => g.workload_id).length, 0);
  const total = c.nodes.reduce((a, n) => a + n.gpus.length, 0);
  main.replaceChildren(
    el("h1", {}, "Cluster now"),
    el("p", { class: "muted" }, `${busy} of ${total} GPUs busy at ${utc(c.now_ms)}. One row per node, one cell per GPU, coloured by team `,
      `(a hue per program, a shade per team).`),
    el("div", { class: "legend", id: "legend" },
      el("span", {}, el("span", { class: "gpu protected", style: "background-color:#667085" }), "protected (inside its minimum runtime)"),
      el("span", {}, el("span", { class: "gpu preemptible", style: "background-color:#667085" }), "preemptible (unallocated, or past its minimum runtime)"),
      el("span", { id: "legend-notice" }, el("span", { class: "gpu notice", style: "background-color:#667085" }),
        "under notice (preempted, checkpointing: free by the deadline at the latest, held for its preemptor)"),
      el("span", { id: "legend-held" }, el("span", { class: "gpu free held" }), "free, held for a preemptor waiting for its victims under notice"),
      Object.keys(colours).filter((p) => tree.nodes[p] && !tree.nodes[p].children.length).sort()
        .map((p) => el("span", { "data-team": p, class: used.has(p) ? "" : "muted" }, swatch(colours[p]), p))),
    el("div", { id: "cluster" }, rows));
}

async function renderWorkload(main, id) {
  const enc = encodeURIComponent(id);
  const doc = await api(`/v1/workloads/${enc}`);
  const [explain, tr] = await Promise.all([
    api(`/v1/workloads/${enc}/explain`).catch((e) => ({ summary: `(no explanation: ${e.message})` })),
    api(`/v1/workloads/${enc}/trace`).catch((e) => ({ spans: [], note: e.message }))]);
  const spec = doc.spec || {};
  const history = doc.history || [];
  // timeline: pending / running segments between the events, a red mark at each preemption
  const t0 = doc.submitted_ms, tEnd = Math.max(doc.ended_ms || Date.now(), ...history.map((h) => h.at_ms));
  const span = Math.max(1, tEnd - t0);
  const segs = [];
  let state = "pending", since = t0;
  const x = (ms) => `${(100 * (ms - t0) / span).toFixed(2)}%`;
  const w = (a, b) => `${Math.max(0.3, 100 * (b - a) / span).toFixed(2)}%`;
  for (const h of history) {
    const next = { "workload.started": "running", "workload.requeued": "pending", "workload.preempted": "pending",
                   "workload.completed": "ended", "workload.failed": "ended", "workload.cancelled": "ended" }[h.type];
    if (!next || next === state) continue;
    if (state !== "ended") segs.push(el("div", { class: `seg ${state}`, style: `left:${x(since)};width:${w(since, h.at_ms)}`, title: `${state} ${dur((h.at_ms - since) / 1000)}` }));
    if (h.type === "workload.preempted") segs.push(el("div", { class: "mark", style: `left:${x(h.at_ms)}`, title: `preempted at ${utc(h.at_ms)}` }, el("span", {}, "▼")));
    state = next; since = h.at_ms;
  }
  if (state !== "ended") segs.push(el("div", { class: `seg ${state}`, style: `left:${x(since)};width:${w(since, tEnd)}` }));
  const last = explain.last_preemption || doc.last_reason;
  main.replaceChildren(
    el("h1", {}, `Workload ${id}`),
    el("div", { class: "facts", id: "facts" },
      el("div", {}, el("b", { id: "state" }, doc.state), "state"),
      el("div", {}, el("b", {}, doc.project), `project (user ${doc.user})`),
      el("div", {}, el("b", {}, `${doc.gpus} ${doc.gpu_type}`), "GPUs"),
      el("div", {}, el("b", {}, dur(spec.min_runtime_s)), `minimum runtime${spec.resumable ? ", resumable" : ""}`),
      el("div", {}, el("b", {}, doc.attempt), "attempt"),
      el("div", {}, el("b", {}, doc.preemptions), "preemptions")),
    el("h2", {}, "Why"),
    el("div", { class: "summary", id: "explanation" }, summaryParts(explain.summary || "–")),
    explain.levels ? el("table", { id: "levels" },
      el("thead", {}, el("tr", {}, ["level", "running GPUs", "due GPUs", "fill", "usage ratio"].map((h) => el("th", {}, h)))),
      el("tbody", {}, explain.levels.map((l) => el("tr", {}, el("td", {}, l.subtree), el("td", { class: "num" }, l.running_gpus),
        el("td", { class: "num" }, num(l.due_gpus, 1)), el("td", { class: "num" }, num(l.fill)), el("td", { class: "num" }, ratioText(l.ratio)))))) : null,
    last ? el("h2", {}, "Last preemption") : null,
    last ? el("p", { id: "last-preemption" }, last.message || "") : null,
    last ? reasonTable(last, id, doc.project) : null,
    last ? sparedTable(last) : null,
    el("h2", {}, "Timeline"),
    el("div", { class: "timeline", id: "timeline" }, segs),
    el("table", { id: "history" },
      el("thead", {}, el("tr", {}, ["time (UTC)", "+", "event", "detail"].map((h) => el("th", {}, h)))),
      el("tbody", {}, history.map((h) => el("tr", { "data-event": h.type },
        el("td", {}, utc(h.at_ms)), el("td", { class: "num" }, dur((h.at_ms - t0) / 1000)), el("td", {}, h.type),
        el("td", {}, h.reason && h.reason.message ? h.reason.message
          : h.placement ? h.placement.map((p) => `${p.node} [${p.gpu_ids.join(",")}]`).join(" ") : ""))))),
    el("h2", {}, "Trace"),
    waterfall(tr));
}

// the explanation as short paragraphs: what the workload is doing now, then why it was last
// stopped; the candidates a preemption spared are the table further down, not a run-on list here
function summaryParts(text) {
  const [now, ...stopped] = text.split(/ (?=Last stopped: )/);
  const out = [el("p", {}, now)];
  for (const part of stopped) {
    const cut = part.search(/ \d+ other running workloads? (?:was|were) considered and spared/);
    out.push(el("p", {}, cut >= 0 ? `${part.slice(0, cut)} (the candidates it spared: "Spared candidates" below)` : part));
  }
  return out;
}

// the reason's numbers side by side: the two subtrees where the paths of preemptor and victim
// part, then the rule and its thresholds (the event's own field names, so they can be looked up)
function reasonTable(r, victimId, victimProject) {
  const v = (x, d = 3) => (x === null || x === undefined) ? "–" : typeof x === "number" && !Number.isInteger(x) ? num(x, d) : String(x);
  // a row neither side has a number for (an unallocated victim has no subtrees to compare) is left out
  const pair = (label, field, a, b) => (a === null || a === undefined) && (b === null || b === undefined) ? null : el("tr", { "data-field": field }, el("th", {}, label), el("td", { class: "num" }, v(a)), el("td", { class: "num" }, v(b)));
  const one = (label, field, x) => el("tr", { "data-field": field }, el("th", {}, label), el("td", { class: "num", colSpan: 2 }, x));
  return el("table", { id: "reason" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "preemptor"), el("th", {}, "victim"))),
    el("tbody", {},
      one("kind", "kind", v(r.kind)),
      one("rule that allowed it", "rule", v(r.rule)),
      pair("workload", "by_workload_id", r.by_workload_id, victimId),
      pair("project", "by_project", r.by_project, victimProject),
      r.level === null || r.level === undefined ? null
        : one("level where their paths part", "level", r.level === "" ? "top of the tree" : v(r.level)),
      pair("subtree", "preemptor_subtree / victim_subtree", r.preemptor_subtree, r.victim_subtree),
      pair("usage ratio", "preemptor_ratio / victim_ratio", r.preemptor_ratio, r.victim_ratio),
      pair("fill (running / due GPUs)", "preemptor_fill / victim_fill", r.preemptor_fill, r.victim_fill),
      pair("running GPUs", "victim_running_gpus", null, r.victim_running_gpus),
      pair("due GPUs now", "victim_due_gpus", null, r.victim_due_gpus),
      r.hysteresis === null || r.hysteresis === undefined ? null : one("hysteresis", "hysteresis", v(r.hysteresis)),
      one("victim protected until", "victim_protected_until_ms", r.victim_protected_until_ms ? utc(r.victim_protected_until_ms) : "– (no protection)"),
      r.node ? one("node", "node", v(r.node)) : null));
}

// the running workloads the victim search looked at and did not take, closest call first, each
// with the rule or the step of the search that spared it (the reason's own codes and sentence)
function sparedTable(r) {
  const rows = r.rejected || [];
  if (!rows.length) return null;
  const considered = r.considered || rows.length;  // counts every one spared; rows keep the closest
  const more = considered - rows.length;
  return el("div", { id: "spared" },
    el("h3", {}, "Spared candidates"),
    el("p", { class: "muted" }, `${considered} other running workload${considered === 1 ? " was" : "s were"} considered and spared` +
      (more > 0 ? `; the ${rows.length} closest calls (${more} more not kept)` : "") + ":"),
    el("table", {},
      el("thead", {}, el("tr", {}, ["workload", "project", "GPUs", "node", "why spared", "detail"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((c) => el("tr", { "data-workload": c.workload_id, "data-reason": c.reason },
        el("td", {}, el("a", { href: `/ui/workloads/${encodeURIComponent(c.workload_id)}` }, c.workload_id)),
        el("td", {}, c.project), el("td", { class: "num" }, c.gpus), el("td", {}, c.node),
        el("td", {}, c.reason), el("td", {}, c.message || ""))))));
}

function waterfall(tr) {
  if (!tr.spans || !tr.spans.length) return el("p", { class: "muted", id: "trace" }, tr.note || "No spans kept for this workload.");
  const spans = tr.spans;
  const t0 = Math.min(...spans.map((s) => s.start_ms)), t1 = Math.max(...spans.map((s) => s.end_ms));
  const total = Math.max(1e-3, t1 - t0);
  const byId = Object.fromEntries(spans.map((s) => [s.span_id, s]));
  const depth = (s) => { let d = 0; while (s.parent_id && byId[s.parent_id] && d < 20) { s = byId[s.parent_id]; d++; } return d; };
  return el("div", { id: "trace" },
    el("p", { class: "muted" }, `trace ${tr.trace_id}: ${spans.length} spans over ${dur(total / 1000)} (${num(total, 1)} ms)`),
    el("div", { class: "waterfall" }, spans.map((s) => {
      const svc = (s.service || "").replace("timeshare.", "");
      const attrs = Object.entries(s.attributes).map(([k, v]) => `${k} = ${v}`).join("\n");
      // a decision the log refused (its leader was deposed) is shown faded: the next leader decided again
      const discarded = s.attributes["timeshare.appended"] === false;
      return el("div", { "data-span": s.name, class: discarded ? "discarded" : "" },
        el("div", { class: "wf-row" },
          el("div", { class: "wf-name", style: `padding-left:${8 + depth(s) * 14}px`, title: s.name },
            s.name, discarded ? " (not in the log)" : ""),
          el("div", { class: "wf-track" }, el("div", { class: `wf-span svc-${svc}`, title: `${num(s.end_ms - s.start_ms, 2)} ms`,
            style: `left:${(100 * (s.start_ms - t0) / total).toFixed(2)}%;width:${(100 * (s.end_ms - s.start_ms) / total).toFixed(2)}%` }))),
        el("details", { class: "span-attrs" }, el("summary", {}, `${svc} · ${utc(s.start_ms)} · ${num(s.end_ms - s.start_ms, 2)} ms`),
          el("pre", {}, attrs)));
    })));
}

// -- wiring --------------------------------------------------------------------------------
const PAGES = { tree: renderTree, queue: renderQueue, cluster: renderCluster,
                workload: (main) => renderWorkload(main, document.body.dataset.workload) };

async function render() {
  const main = document.getElementById("app");
  const page = document.body.dataset.page;
  if (!token()) {
    main.replaceChildren(el("h1", {}, "timeshare"),
      el("p", { id: "status" }, "Give your bearer token (top right) or open this page as /ui#token=YOUR_TOKEN. `make run` prints the demo's tokens."));
    return;
  }
  try {
    await PAGES[page](main);
    document.body.dataset.ready = "1";
  } catch (e) {
    main.replaceChildren(el("h1", {}, document.title.replace(" - timeshare", "")), el("p", { class: "error", id: "status" }, e.message));
    document.body.dataset.ready = "error";
  }
}

async function showWho() {
  try {
    const who = await api("/v1/whoami");
    document.getElementById("whoami").textContent = `${who.user}${who.admin ? " (admin)" : ""}`;
  } catch (_) { document.getElementById("whoami").textContent = ""; }
}

// a token in the fragment (never sent to the server) is kept and removed from the address bar
function takeTokenFromHash() {
  const m = location.hash.match(/token=([^&]+)/);
  if (!m) return false;
  localStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}

function init() {
  takeTokenFromHash();
  // the same page opened again with #token=... does not reload: take the token all the same
  window.addEventListener("hashchange", () => { if (takeTokenFromHash()) { showWho(); render(); } });
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = ev.target.token.value.trim();
    if (t) { localStorage.setItem(TOKEN_KEY, t); ev.target.token.value = ""; showWho(); render(); }
  });
  document.getElementById("open-workload").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = ev.target.id.value.trim();
    if (id) location.href = `/ui/workloads/${encodeURIComponent(id)}`;
  });
  if (token()) showWho();
  render();
  if (document.body.dataset.page !== "workload") setInterval(render, REFRESH_MS);
}

init();
