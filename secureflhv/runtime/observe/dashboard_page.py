"""The job page's HTML, CSS and JavaScript (:mod:`.dashboard` serves them).

Plain JavaScript with no library and nothing loaded from outside: it polls ``api/job`` every second and
redraws. Every value from the parties is inserted as text (``textContent``), never as HTML. Curves are
inline SVG: one chart per curve, one ``circle.pt`` per point.
"""

INDEX_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>secureflhv job</title>
<link rel="stylesheet" href="style.css">
</head>
<body>
<header><h1>secureflhv job <span id="job-id"></span></h1><span id="job-state" class="state"></span>
<span id="updated"></span></header>
<main>
<section><h2>Parties</h2>
<table id="parties"><thead><tr><th>party</th><th>role</th><th>state</th><th>time</th><th>step</th><th>ETA</th>
<th>bytes on the wire per peer (sent / received)</th></tr></thead><tbody></tbody></table>
<p id="errors"></p></section>
<section><h2>Curves</h2><div id="curves"><p class="muted">no curve reported yet</p></div></section>
<section id="final-section" hidden><h2>Final metrics and plots</h2>
<div id="final"></div><div id="plots"></div></section>
<section><h2>Recent log lines</h2><div id="logs"></div></section>
</main>
<script src="app.js"></script>
</body>
</html>
"""

STYLE_CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 10px 18px; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 18px; margin: 0; }
#updated { font-size: 12px; color: #aab; margin-left: auto; }
main { padding: 6px 18px 18px; }
h2 { font-size: 15px; margin: 16px 0 6px; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { border: 1px solid #dde; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef0f4; }
.state { display: inline-block; padding: 1px 8px; border-radius: 9px; font-size: 12px; color: #fff; background: #889; }
.state.running { background: #2d6cdf; } .state.done { background: #2f9e44; } .state.failed { background: #d9480f; }
.state.starting, .state.waiting { background: #889; }
.muted { color: #778; font-size: 13px; }
.err { color: #d9480f; font-size: 13px; margin: 2px 0; }
#curves, #plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; background: #fff; border: 1px solid #dde; padding: 6px; }
figcaption { font-size: 12px; color: #445; }
svg.curve { display: block; }
svg.curve polyline { fill: none; stroke: #2d6cdf; stroke-width: 1.8; }
svg.curve circle.pt { fill: #2d6cdf; }
svg.curve text { font-size: 10px; fill: #556; }
svg.curve line { stroke: #bbc; }
#plots img { max-width: 460px; display: block; }
pre { background: #fff; border: 1px solid #dde; padding: 6px; font-size: 11.5px; max-height: 180px; overflow: auto;
      margin: 4px 0 10px; white-space: pre-wrap; }
.log h3 { font-size: 13px; margin: 8px 0 0; }
#logs { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 0 12px; }
#final-section > div { display: inline-block; vertical-align: top; margin-right: 12px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""

APP_JS = r"""
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";
const shown = {};  // section -> last rendered key, to redraw only what changed

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function bytes(n) {
  const u = ["B", "kB", "MB", "GB", "TB"]; let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function duration(s) {
  if (s === null || s === undefined) return "";
  s = Math.round(s);
  return s >= 3600 ? Math.floor(s / 3600) + "h " + Math.floor(s % 3600 / 60) + "m"
       : s >= 60 ? Math.floor(s / 60) + "m " + (s % 60) + "s" : s + "s";
}
function number(v) {
  return typeof v !== "number" ? String(v) : Number.isInteger(v) ? String(v) : v.toPrecision(5);
}
function replace(id, key, build) {
  if (shown[id] === key) return;
  shown[id] = key;
  const box = document.getElementById(id);
  box.replaceChildren(...build());
}

function partyRow(p, now) {
  const tasks = Object.entries(p.tasks || {});
  const step = tasks.map(([t, v]) => t + " " + v.done + "/" + v.total + (v.info ? " (" + v.info + ")" : "")).join("; ");
  const eta = tasks.filter(([, v]) => v.done < v.total).map(([, v]) => duration(v.eta_s)).join("; ");
  const wire = el("td", {class: "wire"});
  for (const [peer, s] of Object.entries(p.wire || {}))
    wire.append(el("div", {}, peer + ": " + bytes((s.sent || 0) + (s.sent_framing || 0)) + " / " +
                              bytes((s.received || 0) + (s.received_framing || 0))));
  return el("tr", {"data-party": p.id},
    el("td", {}, p.id), el("td", {}, p.role), el("td", {}, el("span", {class: "state " + p.state}, p.state)),
    el("td", {class: "num"}, p.started ? duration((p.state === "running" ? now : p.updated) - p.started) : ""),
    el("td", {}, step), el("td", {}, p.state === "running" ? eta : ""), wire);
}

function chart(party, name, points, steps) {
  const W = 460, H = 200, L = 52, R = 10, T = 10, B = 26;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs, 0), x1 = Math.max(...xs, x0 + 1);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 - y0 < 1e-12) { y0 -= 0.5; y1 += 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const s = svg("svg", {class: "curve", width: W, height: H, viewBox: "0 0 " + W + " " + H,
                        "data-party": party, "data-curve": name, "data-points": points.length});
  s.append(svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B}), svg("line", {x1: L, y1: T, x2: L, y2: H - B}));
  const label = (x, y, text, anchor) => {
    const t = svg("text", {x, y, "text-anchor": anchor}); t.textContent = text; s.append(t);
  };
  label(L - 4, T + 8, y1.toPrecision(4), "end"); label(L - 4, H - B, y0.toPrecision(4), "end");
  label(L, H - 8, String(x0), "start"); label(W - R, H - 8, String(x1), "end");
  label((L + W - R) / 2, H - 8, steps || "step", "middle");
  s.append(svg("polyline", {points: points.map(p => sx(p[0]) + "," + sy(p[1])).join(" ")}));
  for (const p of points) s.append(svg("circle", {class: "pt", cx: sx(p[0]), cy: sy(p[1]), r: 2.6}));
  return el("figure", {}, s, el("figcaption", {}, party + ": " + name + " (" + points.length + " points, last " +
                                 (ys.length ? ys[ys.length - 1].toPrecision(5) : "-") + ")"));
}

function render(job) {
  document.getElementById("job-id").textContent = job.job_id;
  const st = document.getElementById("job-state");
  st.textContent = job.state; st.className = "state " + job.state;
  document.getElementById("updated").textContent = "updated " + new Date(job.now * 1000).toLocaleTimeString();
  const parties = job.parties;
  replace("parties", JSON.stringify([Math.floor(job.now), parties.map(p => [p.id, p.state, p.tasks, p.wire])]), () => {
    const body = el("tbody"); body.append(...parties.map(p => partyRow(p, job.now)));
    return [document.querySelector("#parties thead").cloneNode(true), body];
  });
  replace("errors", JSON.stringify(parties.map(p => p.error)),
          () => parties.filter(p => p.error).map(p => el("div", {class: "err"}, p.error)));
  const curves = parties.flatMap(p => Object.entries(p.curves || {}).filter(([, v]) => v.length)
                                            .map(([k, v]) => [p.id, k, v, (p.curve_steps || {})[k]]));
  replace("curves", JSON.stringify(curves), () =>
    curves.length ? curves.map(([id, k, v, steps]) => chart(id, k, v, steps))
                  : [el("p", {class: "muted"}, "no curve reported yet")]);
  const finals = parties.filter(p => Object.keys(p.final || {}).length || (p.plots || []).length);
  document.getElementById("final-section").hidden = finals.length === 0;
  replace("final", JSON.stringify(finals.map(p => [p.id, p.final])), () => {
    const rows = finals.flatMap(p => Object.entries(p.final || {}).map(([k, v]) =>
      el("tr", {}, el("td", {}, p.id), el("td", {}, k), el("td", {class: "num"}, number(v)))));
    return rows.length ? [el("table", {id: "final-table"}, el("tr", {}, el("th", {}, "party"), el("th", {}, "metric"),
                                                           el("th", {}, "value")), ...rows)] : [];
  });
  replace("plots", JSON.stringify(finals.map(p => [p.id, p.plots])), () =>
    finals.flatMap(p => (p.plots || []).map(name => el("figure", {},
      el("img", {src: "files/" + encodeURIComponent(p.id) + "/" + encodeURIComponent(name) + "?t=" + Date.now(),
                 alt: p.id + " " + name}),
      el("figcaption", {}, p.id + ": " + name)))));
  replace("logs", JSON.stringify(parties.map(p => p.log)), () =>
    parties.map(p => el("div", {class: "log"}, el("h3", {}, p.id),
                        el("pre", {}, (p.log || []).join("\n") || "(no log yet)"))));
  for (const pre of document.querySelectorAll("#logs pre")) pre.scrollTop = pre.scrollHeight;  // newest lines in view
}

async function tick() {
  try {
    const r = await fetch("api/job", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (e) {
    const st = document.getElementById("job-state");
    st.textContent = "page server closed (" + e.message + ")"; st.className = "state";
  }
}
tick();
setInterval(tick, 1000);
"""
