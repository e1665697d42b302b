// kgstream graph explorer (/explorer): find an entity, draw its neighbourhood with the vendored
// Cytoscape.js, read its facts, mentions and relationships' evidence, ask a question and see
// the entities and paths its answer used, and (with an admin key) curate. Every read is an API
// route under the key the page holds, so it shows only what that key may see.
// State for people and tests: #graph carries data-nodes / data-edges (what is drawn) and
// data-view ("entity" or "answer"); <body data-state> is loading / ready / error / key.
"use strict";
(function () {
  const KEY = "kgstream.apiKey";
  const COLORS = {
    PERSON: "#1565c0", ORG: "#ef6c00", GPE: "#2e7d32", LOC: "#9e9d24", FAC: "#558b2f",
    NORP: "#6a1b9a", EVENT: "#00838f", WORK_OF_ART: "#ad1457", LAW: "#5d4037", PRODUCT: "#455a64",
  };
  const $ = (id) => document.getElementById(id);
  let cy = null;
  let admin = false;
  let current = null; // the entity or question drawn: {kind, id|question, name}
  let searchMs = 0; // the last name search's time (window.explorer.timings)
  let drawParts = {}; // the last draw's split: adding the elements, the layout
  const started = performance.now(); // since the page's script ran

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function status(text, state) {
    $("status").textContent = text;
    if (state) document.body.dataset.state = state;
  }

  // ---- the API, under the page's key ---------------------------------------------------
  class NeedKey extends Error {}

  async function api(path, options) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    const init = Object.assign({ headers }, options || {});
    if (init.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(init.body);
    }
    const resp = await fetch(path, init);
    if (resp.status === 401) {
      showKeyForm("The API asks for a key (401).");
      throw new NeedKey("401");
    }
    const body = resp.headers.get("content-type")?.includes("json") ? await resp.json() : {};
    if (!resp.ok) {
      const why = body.detail || body.title || resp.statusText;
      const err = new Error(`${resp.status} ${typeof why === "string" ? why : JSON.stringify(why)}`);
      err.status = resp.status;
      throw err;
    }
    return body;
  }

  function showKeyForm(reason) {
    $("key-form").hidden = false;
    if (reason) $("key-reason").textContent = reason + " The page shows what the key may see; curation needs the admin scope.";
    document.body.dataset.state = "key";
  }

  // ---- drawing ---------------------------------------------------------------------------
  function graph() {
    if (cy) return cy;
    cy = cytoscape({
      container: $("graph"),
      wheelSensitivity: 0.3,
      style: [
        { selector: "node", style: {
          label: "data(label)", "font-size": 10, "text-wrap": "ellipsis", "text-max-width": 120,
          "background-color": "data(color)", width: "data(size)", height: "data(size)",
          color: "#222", "text-valign": "bottom", "text-margin-y": 2 } },
        { selector: "node.center", style: { "border-width": 3, "border-color": "#c62828" } },
        { selector: "node.used", style: { "border-width": 3, "border-color": "#c62828" } },
        { selector: "edge", style: {
          width: "data(width)", "line-color": "#90a4ae", "curve-style": "bezier",
          "target-arrow-shape": "triangle", "target-arrow-color": "#90a4ae", "arrow-scale": 0.7,
          label: "data(label)", "font-size": 8, color: "#546e7a", "text-rotation": "autorotate" } },
        { selector: "edge.weak", style: { "line-style": "dashed", opacity: 0.6 } },
        { selector: "edge.path", style: { "line-color": "#c62828", "target-arrow-color": "#c62828" } },
        { selector: ":selected", style: { "overlay-opacity": 0.15, "overlay-color": "#1565c0" } },
      ],
    });
    cy.on("tap", "node", (e) => {
      if (e.originalEvent && e.originalEvent.shiftKey && admin) { // a pair: the other name
        $("curate-other").value = e.target.data("name");
        $("curation").scrollIntoView();
        return;
      }
      guarded(nodeDetails)(e.target.data());
    });
    cy.on("dbltap", "node", guarded(async (e) => {
      const d = e.target.data();
      if (d.entity) await openEntity(d.entity, d.name);
      else await findAndOpen(d.name);
    }));
    cy.on("tap", "edge", (e) => guarded(edgeDetails)(e.target.data()));
    return cy;
  }

  function draw(elements, view, layoutName) {
    const g = graph();
    const t0 = performance.now();
    g.elements().remove();
    g.add(elements);
    const t1 = performance.now();
    g.layout({ name: layoutName || "cose", animate: false, randomize: false, padding: 30,
      nodeRepulsion: () => 400000, idealEdgeLength: () => 110, edgeElasticity: () => 60,
      nodeOverlap: 40, gravity: 0.2, componentSpacing: 120, numIter: 1500,
      // each step costs the square of the nodes: past 80, cool faster (fewer, larger steps)
      coolingFactor: g.nodes().length > 80 ? 0.95 : 0.99 }).run();
    const t2 = performance.now();
    g.fit(undefined, 30);
    if (g.zoom() > 1.4) { g.zoom(1.4); g.center(); } // a small graph is not blown up
    drawParts = { add_ms: t1 - t0, layout_ms: t2 - t1 };
    const box = $("graph");
    box.dataset.nodes = String(g.nodes().length);
    box.dataset.edges = String(g.edges().length);
    box.dataset.view = view;
    window.explorer = { view, nodes: g.nodes().length, edges: g.edges().length, current,
      names: g.nodes().map((n) => n.data("name")) };
  }

  function nodeSize(mentions) {
    return 14 + Math.min(26, 5 * Math.log2(1 + (mentions || 1)));
  }

  // ---- an entity's neighbourhood ---------------------------------------------------------
  async function search(name, exact) {
    const found = await api(`v1/entities?name=${encodeURIComponent(name)}&limit=10${exact ? "&exact=true" : ""}`);
    const list = $("results");
    list.replaceChildren(el("h2", {}, `Entities matching “${name}”`));
    const ul = el("ul");
    for (const e of found.entities) {
      const li = el("li");
      const a = el("a", { href: `?entity=${encodeURIComponent(e.name)}`, "data-entity": e.id }, e.name);
      a.addEventListener("click", guarded(async (ev) => { ev.preventDefault(); await openEntity(e.id, e.name); }));
      li.append(a, ` ${e.type} · ${e.mentions} mention${e.mentions === 1 ? "" : "s"}`);
      ul.append(li);
    }
    if (!found.entities.length) ul.append(el("li", {}, "nothing you can see matches"));
    list.append(ul);
    return found.entities;
  }

  async function findAndOpen(name) {
    status(`finding ${name}…`, "loading");
    const t0 = performance.now();
    // the name or an alias itself first (index probes); similar names only when none is
    let found = await search(name, true);
    if (!found.length) found = await search(name, false);
    searchMs = performance.now() - t0;
    if (!found.length || found[0].score < 1) { // exact names and aliases score 1
      draw([], "entity");
      const similar = found.length ? " Similar names are listed: pick one." : "";
      status(`No entity you can see is called “${name}”.${similar}`, "ready");
      return;
    }
    await openEntity(found[0].id, found[0].name);
  }

  async function openEntity(id, name) {
    const hops = $("hops").value;
    const limit = $("limit").value || 150;
    status(`drawing ${name || id}…`, "loading");
    const t0 = performance.now();
    const hood = await api(`v1/entities/${id}/neighbourhood?hops=${hops}&limit=${limit}`);
    const t1 = performance.now();
    current = { kind: "entity", id: hood.center.id, name: hood.center.name };
    // the name for people, the id so that a reload opens this entity when two share the name
    history.replaceState(null, "", `?entity=${encodeURIComponent(hood.center.name)}&id=${hood.center.id}&hops=${hops}`);
    const elements = hood.nodes.map((n) => ({
      group: "nodes",
      classes: n.hops === 0 ? "center" : "",
      data: { id: "e" + n.id, entity: n.id, name: n.name, label: n.name, type: n.type,
        mentions: n.mentions, hops: n.hops, color: COLORS[n.type] || "#78909c", size: nodeSize(n.mentions) },
    }));
    for (const r of hood.edges) {
      elements.push({
        group: "edges",
        classes: r.weak ? "weak" : "",
        data: { id: "r" + r.id, relationship: r.id, source: "e" + r.source, target: "e" + r.target,
          label: r.type === "co_occurs" ? "" : r.type, type: r.type, weight: r.weight,
          width: 1 + Math.min(5, Math.log2(1 + r.weight)) },
      });
    }
    draw(elements, "entity");
    const t2 = performance.now();
    legend(hood.nodes);
    const took = Math.round(t2 - t0);
    const cut = hood.notes.length ? ` ${hood.notes.join("; ")}.` : "";
    status(`${hood.center.name}: ${hood.nodes.length} entities, ${hood.edges.length} relationships `
      + `(${hood.neighbours} neighbours in all; snapshot ${hood.snapshot_id ?? "none"}; ${took} ms).${cut}`, "ready");
    await nodeDetails(elements[0].data);
    // where the time went (the bench reads it: bench/bench_explorer.py --browser)
    window.explorer.timings = { since_script_ms: t0 - started, search_ms: searchMs, fetch_ms: t1 - t0,
      draw_ms: t2 - t1, ...drawParts, details_ms: performance.now() - t2 };
  }

  function legend(nodes) {
    const box = $("legend");
    box.replaceChildren();
    for (const type of [...new Set(nodes.map((n) => n.type))].sort()) {
      const item = el("span", { class: "type" }, type);
      item.style.setProperty("--dot", COLORS[type] || "#78909c");
      box.append(item);
    }
  }

  // ---- details: an entity, a relationship -------------------------------------------------
  async function nodeDetails(d) {
    const box = $("details");
    if (!d.entity) {
      box.replaceChildren(el("h2", {}, d.name), el("p", { class: "hint" }, "Double-click to find and explore it."));
      return;
    }
    const [detail, mentions, facts, communities] = await Promise.all([
      api(`v1/entities/${d.entity}?neighbours=10`),
      api(`v1/entities/${d.entity}/mentions?limit=10`),
      api(`v1/facts?entity=${d.entity}&limit=10`).catch(() => ({ facts: [] })),
      api(`v1/communities?entity=${d.entity}&limit=10`),
    ]);
    box.replaceChildren(el("h2", { "data-entity": detail.id }, detail.name));
    const dl = el("dl");
    const row = (k, v) => { dl.append(el("dt", {}, k), el("dd", {}, v)); };
    row("type", detail.type);
    row("mentions", String(detail.mentions));
    if (detail.aliases.length) row("aliases", detail.aliases.join(", "));
    if (detail.description) row("description", detail.description);
    box.append(dl);
    if (facts.facts.length) {
      box.append(el("h3", {}, "Facts in time"));
      const ul = el("ul", { class: "facts" });
      for (const f of facts.facts) {
        ul.append(el("li", {}, `${f.valid_from ?? "…"} – ${f.valid_to ?? "…"}: ${f.sentence} [${f.doc_id}]`));
      }
      box.append(ul);
    }
    if (communities.communities.length) {
      box.append(el("h3", {}, `Communities (snapshot ${communities.snapshot_id})`));
      const cl = el("ul", { class: "communities" });
      for (const c of communities.communities) {
        const li = el("li", { "data-community": c.id });
        li.append(el("strong", {}, `level ${c.level}: ${c.title || "#" + c.id}`), ` (${c.size} entities) ${c.summary}`);
        cl.append(li);
      }
      box.append(cl);
    }
    box.append(el("h3", {}, "Mentions"));
    const ul = el("ul", { class: "mentions" });
    for (const m of mentions.mentions) ul.append(el("li", {}, `“${m.surface}”: ${m.sentence} [${m.doc_id}]`));
    box.append(ul);
    if (detail.neighbours.length) {
      box.append(el("h3", {}, "Strongest relationships"));
      const rl = el("ul");
      for (const n of detail.neighbours) {
        const arrow = n.direction === "out" ? "→" : "←";
        rl.append(el("li", {}, `${n.relation} ${arrow} ${n.name} (${n.weight.toFixed(2)}): ${n.evidence}`));
      }
      box.append(rl);
    }
    if (admin) {
      $("curate-name").value = detail.name;
      $("curation").hidden = false;
    }
  }

  async function edgeDetails(d) {
    const box = $("details");
    if (!d.relationship) {
      box.replaceChildren(el("h2", {}, d.label || "relationship"), el("p", {}, d.evidence || ""));
      return;
    }
    const r = await api(`v1/relationships/${d.relationship}`);
    box.replaceChildren(el("h2", { "data-relationship": r.id }, `${r.source.name} ${r.type} ${r.target.name}`));
    box.append(el("p", {}, `weight ${r.weight}${r.weak ? " · weak: one sentence" : ""}`));
    box.append(el("h3", {}, "Evidence"));
    const ul = el("ul", { class: "evidence" });
    for (const e of r.evidence) ul.append(el("li", {}, `${e.sentence} [${e.doc_id}]`));
    box.append(ul);
  }

  // ---- a question -----------------------------------------------------------------------
  async function ask(question, mode) {
    status("asking…", "loading");
    const t0 = performance.now();
    const resp = await api("v1/query", { method: "POST", body: { question, mode: mode || "auto" } });
    current = { kind: "answer", question };
    history.replaceState(null, "", `?q=${encodeURIComponent(question)}&mode=${encodeURIComponent(mode || "auto")}`);
    const box = $("answer");
    box.hidden = false;
    box.replaceChildren(el("h2", {}, "Answer"), el("p", { class: "answer-text" }, resp.answer));
    box.append(el("p", { class: "hint" }, `mode ${resp.mode_used} · snapshot ${resp.snapshot_id ?? "none"} · ${Math.round(performance.now() - t0)} ms`));
    if (resp.notes.length) box.append(el("p", { class: "hint" }, resp.notes.join("; ")));
    const ol = el("ol", { class: "contexts" });
    for (const c of resp.contexts) ol.append(el("li", {}, `${c.text} [${c.doc_id}]`));
    box.append(el("h3", {}, "Passages"), ol);
    drawAnswer(resp);
  }

  function drawAnswer(resp) {
    const nodes = new Map();
    const edges = [];
    const node = (name, used) => {
      if (!nodes.has(name)) nodes.set(name, { group: "nodes", classes: used ? "used" : "",
        data: { id: "n" + nodes.size, name, label: name, color: "#78909c", size: 24 } });
      return nodes.get(name).data.id;
    };
    for (const name of resp.grounded_entities || []) node(name, true);
    const hops = [...(resp.paths || [])];
    for (const route of resp.routes || []) hops.push(...route.hops);
    for (const [a, rel, b, evidence] of hops) {
      edges.push({ group: "edges", classes: "path",
        data: { id: "h" + edges.length, source: node(a, true), target: node(b, true),
          label: rel === "co_occurs" ? "" : rel, evidence, width: 2.5 } });
    }
    const plan = resp.graph;
    if (plan) {
      for (const start of plan.started_from) node(start.name, true);
      for (const row of plan.rows) {
        const id = node(row.name, false);
        const ev = row.evidence[0];
        if (plan.started_from.length && row.hops > 0) {
          // a plan's row is drawn from its start, labelled with its hops (the relationship that
          // reached it is in its evidence): a star, not the path
          edges.push({ group: "edges", data: { id: "h" + edges.length, source: node(plan.started_from[0].name, true),
            target: id, label: `${row.hops} hop${row.hops > 1 ? "s" : ""}`,
            evidence: ev ? `${ev.relationship}: ${ev.sentence} [${ev.doc_id}]` : "", width: 2 } });
        }
      }
    }
    $("legend").replaceChildren();
    draw([...nodes.values(), ...edges], "answer", "cose");
    status(`${nodes.size} entities and ${edges.length} hops the answer used (${resp.mode_used}). Double-click an entity to explore it.`, "ready");
  }

  // ---- curation (admin keys) --------------------------------------------------------------
  async function probeAdmin() {
    try {
      const found = await api("v1/curations");
      admin = true;
      listCurations(found.curations);
    } catch (err) {
      if (err instanceof NeedKey) throw err;
      admin = false; // 403: this key may read, not curate
    }
    $("curation").hidden = !admin;
    $("review").hidden = !admin;
  }

  function when(iso) {
    return new Date(iso).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  function listCurations(curations) {
    const ol = $("curations");
    ol.replaceChildren();
    for (const c of curations.slice(-20).reverse()) {
      const li = el("li", { "data-curation": c.id },
        `#${c.id} ${c.kind} ${c.name} · ${c.other ?? c.new_name ?? ""} — ${c.status}, by ${c.created_by} at ${when(c.created_at)}${c.reason ? ": " + c.reason : ""}`);
      if (c.status === "pending" || c.status === "applied") {
        const undo = el("button", { type: "button", class: "undo" }, "Undo");
        undo.addEventListener("click", () => undoCuration(c.id));
        li.append(" ", undo);
      }
      ol.append(li);
    }
  }

  async function curate(ev) {
    ev.preventDefault();
    const body = { kind: $("curate-kind").value, name: $("curate-name").value.trim(),
      other: $("curate-other").value.trim(), reason: $("curate-reason").value.trim() };
    try {
      const made = await api("v1/curations", { method: "POST", body });
      $("curate-status").textContent = `Rule #${made.id} (${made.kind}) is ${made.status}: the indexer applies it to the stored documents shortly.`;
      listCurations((await api("v1/curations")).curations);
    } catch (err) {
      $("curate-status").textContent = `Not made: ${err.message}`;
    }
  }

  async function undoCuration(id) {
    const reason = prompt(`Why undo rule #${id}?`, "") ?? "";
    try {
      await api(`v1/curations/${id}/undo`, { method: "POST", body: { reason } });
      listCurations((await api("v1/curations")).curations);
      $("curate-status").textContent = `Rule #${id} is being undone.`;
    } catch (err) {
      $("curate-status").textContent = `Not undone: ${err.message}`;
    }
  }

  // ---- review (admin keys): the sample as pairs to judge -----------------------------------
  let reviewItems = [];

  async function loadReview() {
    const found = await api(`v1/review/sample?n=10&merged_share=${$("review-share").value}`);
    reviewItems = found.items;
    const ol = $("review-items");
    ol.replaceChildren();
    reviewItems.forEach((item, i) => {
      const li = el("li", { "data-review": item.id });
      const ask = item.kind === "merged" ? "Merged: are these one thing?" : "Kept apart: are these one thing?";
      li.append(el("strong", {}, ask));
      for (const side of [item.a, item.b]) {
        const first = side.contexts[0];
        li.append(el("p", {}, `${side.entity} (${side.type}) as “${first.surface}”: ${first.sentence} [${first.doc_id}]`));
      }
      const choices = el("span", { class: "verdicts" });
      for (const label of ["same", "different", "unsure"]) {
        const id = `verdict-${i}-${label}`;
        const radio = el("input", { type: "radio", name: `verdict-${i}`, value: label, id });
        radio.addEventListener("change", () => { item.label = label; });
        choices.append(radio, el("label", { for: id }, label), " ");
      }
      li.append(choices);
      ol.append(li);
    });
    $("review-apply").hidden = !reviewItems.length;
    if (!reviewItems.length) ol.append(el("li", {}, "nothing to review: no merges or suspect pairs"));
  }

  async function applyReview() {
    const judged = reviewItems.filter((item) => item.label);
    if (!judged.length) {
      $("review-results").replaceChildren(el("li", {}, "judge at least one pair first"));
      return;
    }
    const done = await api("v1/review/verdicts", { method: "POST", body: { items: judged } });
    const ol = $("review-results");
    ol.replaceChildren();
    for (const row of done.curations) {
      const what = row.kind ? `${row.kind} ${row.name} / ${row.other}: ${row.result}` : `nothing to make: ${row.result}`;
      ol.append(el("li", { "data-line": row.line }, what));
    }
    const acc = done.figures.linking_accuracy;
    if (acc && acc.share !== null) ol.append(el("li", { class: "hint" }, `linking accuracy on these: ${(100 * acc.share).toFixed(0)}% of ${acc.of}`));
    listCurations((await api("v1/curations")).curations);
  }

  // ---- start ------------------------------------------------------------------------------
  function guarded(fn) {
    return async (...args) => {
      try {
        await fn(...args);
      } catch (err) {
        if (err instanceof NeedKey) return;
        status(`Error: ${err.message}`, "error");
      }
    };
  }

  async function start() {
    $("search-form").addEventListener("submit", guarded(async (ev) => {
      ev.preventDefault();
      await findAndOpen($("search-input").value.trim());
    }));
    $("ask-form").addEventListener("submit", guarded(async (ev) => {
      ev.preventDefault();
      await ask($("ask-input").value.trim(), $("ask-mode").value);
    }));
    $("curate-form").addEventListener("submit", guarded(curate));
    $("review-load").addEventListener("click", guarded(loadReview));
    $("review-apply").addEventListener("click", guarded(applyReview));
    $("key-button").addEventListener("click", () => showKeyForm(""));
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, $("key-input").value.trim());
      location.reload();
    });
    $("key-clear").addEventListener("click", () => { sessionStorage.removeItem(KEY); location.reload(); });
    const params = new URLSearchParams(location.search);
    if (params.get("hops") === "2") $("hops").value = "2";
    await probeAdmin();
    if (params.get("id")) {
      $("search-input").value = params.get("entity") || "";
      await openEntity(Number(params.get("id")), params.get("entity"));
    } else if (params.get("entity")) {
      $("search-input").value = params.get("entity");
      await findAndOpen(params.get("entity"));
    } else if (params.get("q")) {
      $("ask-input").value = params.get("q");
      if (params.get("mode")) $("ask-mode").value = params.get("mode");
      await ask(params.get("q"), params.get("mode") || "auto");
    } else {
      status("Find an entity, or ask a question.", "ready");
    }
  }

  window.kgExplorer = { openEntity, findAndOpen, ask, cy: graph };
  document.addEventListener("DOMContentLoaded", guarded(start));
})();
