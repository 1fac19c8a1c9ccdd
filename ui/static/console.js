// dafka console: keeps pages live. No inline script (the Content-Security-Policy forbids it), no framework:
// the server renders every page; this file refreshes their content, draws the charts and follows live tails.
"use strict";

function withFragment(url) {
  const u = new URL(url, window.location.href);
  u.searchParams.set("fragment", "1");
  return u.toString();
}

// A page whose #content has data-refresh="ms" asks the server for its content again that often, while shown.
function keepFresh(content) {
  const every = parseInt(content.dataset.refresh, 10);
  if (!every) return;
  let busy = false;
  setInterval(async () => {
    if (busy || document.visibilityState !== "visible") return;
    const open = new Set([...content.querySelectorAll("details[open]")].map((d) => d.closest("tr")?.dataset.offset));
    busy = true;
    try {
      const response = await fetch(withFragment(window.location.href), { headers: { Accept: "text/html" } });
      if (response.ok) {
        content.innerHTML = await response.text(); // the server's template, escaped there
        content.querySelectorAll("tr[data-offset] details").forEach((d) => {
          if (open.has(d.closest("tr").dataset.offset)) d.open = true;
        });
        content.dataset.refreshed = String(Date.now());
      }
    } catch (e) {
      /* the console went away: try again later */
    } finally {
      busy = false;
    }
  }, every);
}

const SVG = "http://www.w3.org/2000/svg";

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function draw(svg, points) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = Math.max(100, Math.round(svg.clientWidth)), H = 120, span = 300;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`); // drawn at the element's own size: text is not stretched
  const top = niceMax(Math.max(0, ...points.map((p) => p[1])));
  for (const f of [0, 0.5, 1]) {
    const line = document.createElementNS(SVG, "line");
    line.setAttribute("x1", "0"); line.setAttribute("x2", String(W));
    line.setAttribute("y1", String(H - f * (H - 14))); line.setAttribute("y2", String(H - f * (H - 14)));
    line.setAttribute("class", "grid-line");
    svg.appendChild(line);
  }
  const label = document.createElementNS(SVG, "text");
  label.setAttribute("x", "4"); label.setAttribute("y", "11"); label.setAttribute("class", "axis");
  label.textContent = top.toLocaleString();
  svg.appendChild(label);
  if (points.length < 2) return;
  const xy = points.map(([t, v]) => `${(W * (span + t) / span).toFixed(1)},${(H - (v / top) * (H - 14)).toFixed(1)}`);
  const area = document.createElementNS(SVG, "polygon");
  area.setAttribute("points", `${xy[0].split(",")[0]},${H} ${xy.join(" ")} ${xy[xy.length - 1].split(",")[0]},${H}`);
  area.setAttribute("class", "area");
  svg.appendChild(area);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", xy.join(" "));
  line.setAttribute("class", "line");
  svg.appendChild(line);
  const last = document.createElementNS(SVG, "text");
  last.setAttribute("x", String(W - 4)); last.setAttribute("y", "11"); last.setAttribute("class", "axis end");
  last.textContent = "now " + Math.round(points[points.length - 1][1]).toLocaleString();
  svg.appendChild(last);
}

function chart(svg) {
  const update = async () => {
    if (document.visibilityState !== "visible") return;
    try {
      const response = await fetch(svg.dataset.source);
      if (response.ok) draw(svg, (await response.json()).points);
    } catch (e) { /* later */ }
  };
  update();
  setInterval(update, 2000);
}

// The live tail: server-sent events of the topic's new records; Pause closes the stream (the console then
// stops following the topic), Resume opens it again.
function tail(table) {
  const body = table.querySelector("tbody");
  const button = document.getElementById("tail-toggle");
  const status = document.getElementById("tail-status");
  const format = document.getElementById("tail-format");
  let source = null, received = 0, skipped = 0;
  const MAX_ROWS = 500;
  const open = () => {
    const url = new URL("/api/tail", window.location.href);
    url.searchParams.set("topic", table.dataset.topic);
    url.searchParams.set("format", format.value);
    source = new EventSource(url);
    source.onopen = () => { status.textContent = `following · ${received} received`; };
    source.onerror = () => { status.textContent = "reconnecting…"; };
    source.onmessage = (event) => {
      const data = JSON.parse(event.data);
      skipped += data.skipped;
      for (const r of data.records) {
        const row = document.createElement("tr");
        row.dataset.offset = String(r.offset);
        for (const [text, cls] of [[r.partition.slice(0, 8) + "…", "mono"], [String(r.offset), "num mono"],
                                   [r.size + " B", "num"], [r.key === null ? "–" : r.key, "mono key"]]) {
          const cell = document.createElement("td");
          cell.className = cls; cell.textContent = text; row.appendChild(cell);
        }
        const cell = document.createElement("td");
        const tag = document.createElement("span"); tag.className = "fmt"; tag.textContent = r.format;
        const pre = document.createElement("pre"); pre.className = "value"; pre.textContent = r.text;
        cell.appendChild(tag); cell.appendChild(pre); row.appendChild(cell);
        body.insertBefore(row, body.firstChild);
        received += 1;
      }
      while (body.rows.length > MAX_ROWS) body.deleteRow(body.rows.length - 1);
      status.textContent = `following · ${received} received` + (skipped ? ` · ${skipped} skipped (too fast to show)` : "");
    };
    button.textContent = "Pause";
  };
  const close = () => {
    if (source) source.close();
    source = null;
    button.textContent = "Resume";
    status.textContent = `paused · ${received} received`;
  };
  button.addEventListener("click", () => (source ? close() : open()));
  format.addEventListener("change", () => { if (source) { close(); open(); } });
  open();
}

document.addEventListener("DOMContentLoaded", () => {
  const content = document.getElementById("content");
  if (content) keepFresh(content);
  document.querySelectorAll("svg[data-source]").forEach(chart);
  const t = document.getElementById("tail");
  if (t) tail(t);
});
