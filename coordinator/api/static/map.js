// The fleet map: country outlines from the vendored world atlas (world-atlas' TopoJSON of
// Natural Earth's 1:110m countries) drawn with d3-geo and topojson-client; agents as
// labelled markers coloured by status, merged into one numbered cluster when they share
// a place on screen; drag to pan, wheel or the +/- buttons to zoom. Agent ids are hostile
// text: placed with textContent or setAttribute only.
"use strict";

const MAP_W = 960;
const MAP_H = 400;
const MAP_NS = "http://www.w3.org/2000/svg";
const MAP_MAX_ZOOM = 48;
const CLUSTER_CELL = 40;    // the clustering's lookup grid, px (more than a cluster's reach)
const MAX_LABELS = 150;     // marker labels placed (the rest: their title on hover)
const MAX_NAMES = 80;       // country names placed
const STATUS_RANK = { live: 0, draining: 1, suspect: 2, down: 3 };

// A marker's radius on screen: one agent, or a cluster of n (growing slowly with n).
function markerRadius(n) { return n === 1 ? 5 : Math.min(16, 8 + 2 * Math.log2(n)); }

// Clusters whose circles overlap once grown are merged (a few passes; skipped for a
// view with very many clusters, where the circles are small and far apart anyway).
function mergeOverlapping(groups) {
  if (groups.length > 400) return;
  for (let pass = 0; pass < 4; pass++) {
    let merged = false;
    for (let i = 0; i < groups.length; i++) {
      const a = groups[i];
      if (!a.ids.length) continue;
      for (let j = i + 1; j < groups.length; j++) {
        const b = groups[j];
        if (!b.ids.length) continue;
        const d = Math.hypot(a.sx / a.ids.length - b.sx / b.ids.length, a.sy / a.ids.length - b.sy / b.ids.length);
        if (d >= markerRadius(a.ids.length) + markerRadius(b.ids.length)) continue;
        a.ids.push(...b.ids); a.sx += b.sx; a.sy += b.sy;
        for (const site of b.sites) a.sites.add(site);
        if (STATUS_RANK[b.worst] > STATUS_RANK[a.worst]) a.worst = b.worst;
        b.ids = [];
        merged = true;
      }
    }
    if (!merged) break;
  }
  let kept = 0;
  for (const g of groups) if (g.ids.length) groups[kept++] = g;
  groups.length = kept;
}

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(MAP_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// Greedy label placement: a box is kept if it overlaps no box kept before.
class Boxes {
  constructor() { this.kept = []; }
  fits(x0, y0, x1, y1) {
    for (const b of this.kept) if (x0 < b[2] && x1 > b[0] && y0 < b[3] && y1 > b[1]) return false;
    return true;
  }
  add(x0, y0, x1, y1) { this.kept.push([x0, y0, x1, y1]); }
}

class FleetMap {
  constructor(svg, { statusOf, onOpen }) {
    this.svg = svg;
    this.statusOf = statusOf;
    this.onOpen = onOpen;
    // Natural Earth projection, the inhabited latitudes (58 S to 84 N) fitted to the box.
    const extent = { type: "MultiPoint", coordinates: [[-180, 0], [180, 0], [0, 84], [0, -58]] };
    this.projection = d3.geoNaturalEarth1().fitExtent([[8, 8], [MAP_W - 8, MAP_H - 8]], extent);
    this.path = d3.geoPath(this.projection);
    this.k = 1; this.x = 0; this.y = 0;    // zoom and pan: screen = base * k + (x, y)
    this.points = new Map();                // agent_id -> {x, y, status, label}
    this.countries = [];                    // {name, x, y, area} by area, largest first
    this.atlas = "loading";
    this.pending = false;
    this.view = document.getElementById("map-view");
    this.land = document.getElementById("map-land");
    this.names = document.getElementById("map-names");
    this.markers = document.getElementById("map-markers");
    this.view.insertBefore(svgNode("path", { class: "graticule", d: this.path(d3.geoGraticule10()) }), this.land);
    this.bindEvents();
  }

  // The atlas as JSON (fetched while the fleet loads; drawn after it: drawAtlas).
  async fetchAtlas(url) {
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`${response.status}`);
      return await response.json();
    } catch (error) {
      this.atlas = `failed: ${error.message}`;
      return null;
    }
  }

  // Country outlines, borders and the names' places from world-atlas' TopoJSON.
  drawAtlas(topology) {
    if (!topology || this.atlas === "loaded") return;
    const features = topojson.feature(topology, topology.objects.countries).features;
    const fragment = document.createDocumentFragment();
    const countries = [];
    for (const f of features) {
      const name = (f.properties && f.properties.name) || "";
      const node = svgNode("path", { class: "country", d: this.path(f), "data-name": name });
      node.appendChild(svgNode("title", {}, name));
      fragment.appendChild(node);
      const [x, y] = this.path.centroid(f);
      if (name && Number.isFinite(x)) countries.push({ name, x, y, area: this.path.area(f) });
    }
    const borders = topojson.mesh(topology, topology.objects.countries, (a, b) => a !== b);
    fragment.appendChild(svgNode("path", { class: "border", d: this.path(borders) }));
    this.land.replaceChildren(fragment);
    countries.sort((a, b) => b.area - a.area);
    this.countries = countries;
    this.atlas = "loaded";
    performance.mark("edgefleet-atlas-drawn");
    this.schedule();
  }

  // An agent's marker; true when what the map shows of it changed (place, status, id).
  set(a) {
    const old = this.points.get(a.agent_id);
    if (!a.location || !Number.isFinite(a.location.lat) || !Number.isFinite(a.location.lon)) {
      if (old) this.points.delete(a.agent_id);
      return Boolean(old);
    }
    const status = this.statusOf(a);
    if (old && old.lat === a.location.lat && old.lon === a.location.lon && old.status === status
        && old.site === (a.site || "")) return false;
    const projected = this.projection([a.location.lon, a.location.lat]);
    if (!projected) return false;
    this.points.set(a.agent_id, { x: projected[0], y: projected[1], lat: a.location.lat,
      lon: a.location.lon, status, site: a.site || "" });
    return true;
  }

  remove(agentId) { if (this.points.delete(agentId)) this.schedule(); }

  clear() { this.points.clear(); this.markers.replaceChildren(); }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }

  // Everything on screen from the markers' base positions and the view (k, x, y).
  render() {
    const { k, x, y } = this;
    this.view.setAttribute("transform", `translate(${x.toFixed(2)},${y.toFixed(2)}) scale(${k.toFixed(4)})`);
    // Greedy clustering on screen: a marker joins the nearest cluster whose circle (grown
    // by it) would touch it, else starts its own. Clusters are found through a grid of
    // CLUSTER_CELL px cells, so the pass is linear in the agents.
    const cells = new Map();
    const groups = [];
    for (const [id, p] of this.points) {
      const sx = p.x * k + x, sy = p.y * k + y;
      if (sx < -CLUSTER_CELL || sx > MAP_W + CLUSTER_CELL || sy < -CLUSTER_CELL || sy > MAP_H + CLUSTER_CELL) continue;
      const cx = Math.floor(sx / CLUSTER_CELL), cy = Math.floor(sy / CLUSTER_CELL);
      let best = null, bestD = Infinity;
      for (let i = cx - 1; i <= cx + 1; i++) {
        for (let j = cy - 1; j <= cy + 1; j++) {
          for (const g of cells.get(`${i},${j}`) || []) {
            const d = Math.hypot(g.sx / g.ids.length - sx, g.sy / g.ids.length - sy);
            if (d < markerRadius(g.ids.length + 1) + 6 && d < bestD) { best = g; bestD = d; }
          }
        }
      }
      if (!best) {
        best = { ids: [], sx: 0, sy: 0, worst: "live", sites: new Set() };
        groups.push(best);
        const key = `${cx},${cy}`;
        if (!cells.has(key)) cells.set(key, []);
        cells.get(key).push(best);
      }
      best.ids.push(id); best.sx += sx; best.sy += sy; best.sites.add(p.site);
      if (STATUS_RANK[p.status] > STATUS_RANK[best.worst]) best.worst = p.status;
    }
    mergeOverlapping(groups);
    const boxes = new Boxes();
    const fragment = document.createDocumentFragment();
    // Clusters first, then the biggest: they get their labels before single markers.
    groups.sort((a, b) => b.ids.length - a.ids.length);
    let labels = 0;
    for (const g of groups) {
      const n = g.ids.length;
      const cx = g.sx / n, cy = g.sy / n;
      const r = markerRadius(n);
      const node = svgNode("g", { transform: `translate(${cx.toFixed(1)},${cy.toFixed(1)})` });
      const statuses = n === 1 ? this.points.get(g.ids[0]).status : g.worst;
      node.appendChild(svgNode("circle", { r }));
      boxes.add(cx - r, cy - r, cx + r, cy + r);
      let label;
      if (n === 1) {
        const id = g.ids[0];
        node.setAttribute("class", `marker ${statuses}`);
        node.setAttribute("data-agent", id);
        node.appendChild(svgNode("title", {}, `${id} (${this.points.get(id).site || "no site"}): ${statuses}`));
        label = id;
      } else {
        node.setAttribute("class", `cluster ${statuses}`);
        node.setAttribute("data-count", n);
        node.appendChild(svgNode("text", { class: "count", "text-anchor": "middle", dy: "0.35em" }, n));
        const sites = [...g.sites];
        const shown = g.ids.slice(0, 20).join(", ");
        node.appendChild(svgNode("title", {},
          `${n} agents${sites.length === 1 && sites[0] ? ` at ${sites[0]}` : ""} (worst: ${statuses}): ${shown}${n > 20 ? ", ..." : ""}. Click to zoom in.`));
        label = sites.length === 1 && sites[0] ? sites[0] : "";
      }
      if (label && labels < MAX_LABELS) {
        const w = Math.min(label.length, 32) * 6.6 + 4, h = 14;
        for (const [lx, anchor] of [[cx + r + 3, "start"], [cx - r - 3, "end"]]) {
          const x0 = anchor === "start" ? lx : lx - w;
          if (x0 >= 0 && x0 + w <= MAP_W && boxes.fits(x0, cy - h / 2, x0 + w, cy + h / 2)) {
            boxes.add(x0, cy - h / 2, x0 + w, cy + h / 2);
            node.appendChild(svgNode("text", { class: "label", x: lx - cx, y: 4, "text-anchor": anchor },
              label.length > 32 ? `${label.slice(0, 31)}…` : label));
            labels += 1;
            break;
          }
        }
      }
      fragment.appendChild(node);
    }
    // Country names where they have room, under the markers and their labels.
    const names = document.createDocumentFragment();
    let placed = 0;
    for (const c of this.countries) {
      if (placed >= MAX_NAMES || c.area * k * k < 2500) break;
      const sx = c.x * k + x, sy = c.y * k + y;
      const w = c.name.length * 5.6, h = 12;
      if (sx - w / 2 < 0 || sx + w / 2 > MAP_W || sy < h || sy > MAP_H) continue;
      if (!boxes.fits(sx - w / 2, sy - h / 2, sx + w / 2, sy + h / 2)) continue;
      boxes.add(sx - w / 2, sy - h / 2, sx + w / 2, sy + h / 2);
      names.appendChild(svgNode("text", { class: "country-name", x: sx.toFixed(1), y: (sy + 4).toFixed(1), "text-anchor": "middle" }, c.name));
      placed += 1;
    }
    this.names.replaceChildren(names);
    this.markers.replaceChildren(fragment);
  }

  // The map's base coordinates (before zoom and pan) of a screen point of the SVG.
  toBase(sx, sy) { return [(sx - this.x) / this.k, (sy - this.y) / this.k]; }

  // The map's coordinates of where ``event`` points: measured from the SVG's content box
  // (inside its border), which the viewBox fills.
  svgPoint(event) {
    const svg = this.svg;
    const box = svg.getBoundingClientRect();
    const left = box.left + svg.clientLeft, top = box.top + svg.clientTop;
    return [((event.clientX - left) * MAP_W) / svg.clientWidth, ((event.clientY - top) * MAP_H) / svg.clientHeight];
  }

  zoomAt(sx, sy, factor) {
    const k = Math.min(MAP_MAX_ZOOM, Math.max(1, this.k * factor));
    const [bx, by] = this.toBase(sx, sy);
    this.k = k;
    this.x = sx - bx * k;
    this.y = sy - by * k;
    this.clamp();
    this.schedule();
  }

  clamp() {
    this.x = Math.min(0, Math.max(MAP_W * (1 - this.k), this.x));
    this.y = Math.min(0, Math.max(MAP_H * (1 - this.k), this.y));
  }

  reset() { this.k = 1; this.x = 0; this.y = 0; this.schedule(); }

  bindEvents() {
    const svg = this.svg;
    let drag = null;
    let moved = false;
    svg.addEventListener("wheel", (event) => {
      event.preventDefault();
      const [sx, sy] = this.svgPoint(event);
      this.zoomAt(sx, sy, Math.exp(-event.deltaY * 0.0025));
    }, { passive: false });
    svg.addEventListener("pointerdown", (event) => {
      if (event.button !== 0) return;
      drag = { px: event.clientX, py: event.clientY, x: this.x, y: this.y };
      moved = false;
    });
    svg.addEventListener("pointermove", (event) => {
      if (!drag) return;
      const dx = event.clientX - drag.px, dy = event.clientY - drag.py;
      if (!moved && Math.hypot(dx, dy) < 4) return;
      if (!moved) { moved = true; svg.setPointerCapture(event.pointerId); svg.classList.add("dragging"); }
      this.x = drag.x + (dx * MAP_W) / svg.clientWidth;
      this.y = drag.y + (dy * MAP_H) / svg.clientHeight;
      this.clamp();
      this.schedule();
    });
    const end = () => { drag = null; svg.classList.remove("dragging"); };
    svg.addEventListener("pointerup", end);
    svg.addEventListener("pointercancel", end);
    svg.addEventListener("click", (event) => {
      if (moved) { moved = false; return; }
      const marker = event.target.closest && event.target.closest("[data-agent]");
      if (marker) { this.onOpen(marker.getAttribute("data-agent")); return; }
      const cluster = event.target.closest && event.target.closest(".cluster");
      if (cluster) {
        const [sx, sy] = this.svgPoint(event);
        this.zoomAt(sx, sy, 3);
      }
    });
    document.getElementById("map-zoom-in").addEventListener("click", () => this.zoomAt(MAP_W / 2, MAP_H / 2, 2));
    document.getElementById("map-zoom-out").addEventListener("click", () => this.zoomAt(MAP_W / 2, MAP_H / 2, 0.5));
    document.getElementById("map-reset").addEventListener("click", () => this.reset());
  }
}

window.FleetMap = FleetMap;
