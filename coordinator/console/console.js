// The admin console: sign in with the admin token, list SKUs, watch one SKU
// live and take the admin actions. It speaks only the coordinator's admin
// API (docs/api.md), as escrowctl does; the live view reads the same
// `GET /v1/admin/skus/{tenant}/{sku}` as `escrowctl sku watch` and shows
// the same figures. Plain script, no framework and no build step: the
// coordinator embeds this file as it is.
"use strict";

/** The live view reads the SKU this often: twice a second. */
const VIEW_REFRESH_MS = 500;
/** The SKU list is read again this often: one query of at most PAGE_SKUS lines. */
const LIST_REFRESH_MS = 1000;
/** A request not answered within this counts as the coordinator not answering. */
const REQUEST_TIMEOUT_MS = 2000;
/** SKUs in a page of the list. */
const PAGE_SKUS = 50;
/** Where the token is kept: this tab's session storage, gone with the tab. */
const TOKEN_KEY = "escrow-admin-token";

const $ = (id) => document.getElementById(id);

/** The coordinator answered, and refused: its status and outcome body. */
class Refused extends Error {
  constructor(status, body) {
    const outcome = body && body.outcome ? body.outcome : "";
    const detail = body && body.error ? `: ${body.error}` : "";
    super(`${status} ${outcome}${detail}`.trim());
    this.status = status;
    this.outcome = outcome;
  }
}

/** The coordinator did not answer (no connection, or not in time). */
class Unreachable extends Error {}

const state = {
  token: null,
  /** The list page shown: where it starts, and where the next one would. */
  after: null,
  next: null,
  /** The SKU in the live view, `{tenant, sku}`, or null. */
  open: null,
  /** Bumped on every change of SKU, so an old refresh loop stops. */
  generation: 0,
  viewTimer: null,
  listTimer: null,
  /** The latest view read. */
  view: null,
  /** The change form is filled from the first view read, not on each refresh. */
  formFilled: false,
  busy: false,
};

/** Calls the admin API; the answer's JSON, or throws Refused or Unreachable. */
async function api(method, path, body) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: controller.signal,
      cache: "no-store",
    });
  } catch (error) {
    throw new Unreachable(
      error.name === "AbortError"
        ? `no answer within ${REQUEST_TIMEOUT_MS} ms`
        : "the coordinator cannot be reached",
    );
  } finally {
    clearTimeout(timer);
  }
  let json = null;
  try {
    json = await response.json();
  } catch {
    json = null;
  }
  if (!response.ok) {
    throw new Refused(response.status, json);
  }
  return json;
}

/** The admin API path of one SKU, with `suffix` (e.g. `/pause`). */
function skuPath(tenant, sku, suffix = "") {
  return `/v1/admin/skus/${encodeURIComponent(tenant)}/${encodeURIComponent(sku)}${suffix}`;
}

/** Shows `text` in the outcome element `id`, as an error or a success. */
function say(id, kind, text) {
  const element = $(id);
  element.className = `outcome ${kind}`;
  element.textContent = text;
}

/** What a failed call tells the admin; a refused token signs out. */
function explain(error) {
  if (error instanceof Refused) {
    if (error.status === 401) {
      signOut("The coordinator refused the token (401 UNAUTHORIZED): sign in again.");
    }
    return `Refused: ${error.message}`;
  }
  if (error instanceof Unreachable) {
    return `Not answering: ${error.message}`;
  }
  throw error;
}

// ---- Sign in ----------------------------------------------------------

async function signIn(token, announce) {
  state.token = token;
  try {
    await api("GET", "/v1/admin/skus?limit=1");
  } catch (error) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (announce) {
      const text =
        error instanceof Refused && error.status === 401
          ? "Refused: 401 UNAUTHORIZED: this is not the coordinator's admin token."
          : explain(error);
      say("sign-in-outcome", "error", text);
    }
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  say("sign-in-outcome", "", "");
  $("sign-in").hidden = true;
  $("console").hidden = false;
  $("sign-out").hidden = false;
  $("connection").textContent = `Signed in to ${location.host}`;
  refreshList();
  route(false);
  if (announce) {
    $("sku-table").querySelector("a")?.focus();
  }
}

function signOut(message) {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(state.listTimer);
  closeView();
  $("console").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("connection").textContent = "";
  say("sign-in-outcome", message ? "error" : "", message || "");
  $("token").focus();
}

// ---- The SKU list -----------------------------------------------------

async function refreshList() {
  clearTimeout(state.listTimer);
  if (!state.token) {
    return;
  }
  let query = `?limit=${PAGE_SKUS}`;
  if (state.after) {
    query += `&after=${encodeURIComponent(state.after)}`;
  }
  try {
    const page = await api("GET", `/v1/admin/skus${query}`);
    renderList(page);
    say("sku-list-outcome", "", "");
  } catch (error) {
    say("sku-list-outcome", "error", explain(error));
  }
  if (state.token) {
    state.listTimer = setTimeout(refreshList, LIST_REFRESH_MS);
  }
}

function renderList(page) {
  const rows = page.skus.map((line) => {
    const row = document.createElement("tr");
    const name = document.createElement("th");
    name.scope = "row";
    const link = document.createElement("a");
    link.href = `#/sku/${encodeURIComponent(line.tenant)}/${encodeURIComponent(line.sku)}`;
    link.textContent = `${line.tenant}/${line.sku}`;
    if (state.open && state.open.tenant === line.tenant && state.open.sku === line.sku) {
      link.setAttribute("aria-current", "page");
    }
    name.append(link);
    row.append(name);
    for (const value of [line.total, line.sold, line.held, line.available]) {
      const cell = document.createElement("td");
      cell.className = "num";
      cell.textContent = value;
      row.append(cell);
    }
    const status = document.createElement("td");
    status.textContent = `${line.paused ? "Paused" : "Selling"}, ${line.mode}`;
    row.append(status);
    return row;
  });
  $("sku-rows").replaceChildren(...rows);
  $("sku-list-empty").hidden = rows.length > 0 || state.after !== null;
  state.next = page.next;
  $("next-page").hidden = page.next === null;
  $("first-page").hidden = state.after === null;
}

// ---- The live view ----------------------------------------------------

/** Opens the SKU the address names (`#/sku/TENANT/SKU`), or none. */
function route(moveFocus) {
  const match = /^#\/sku\/([^/]+)\/([^/]+)$/.exec(location.hash);
  if (!match) {
    closeView();
    return;
  }
  openView(decodeURIComponent(match[1]), decodeURIComponent(match[2]));
  if (moveFocus) {
    $("view-title").focus();
  }
}

function openView(tenant, sku) {
  closeView();
  state.open = { tenant, sku };
  $("view-title").textContent = `${tenant}/${sku}`;
  $("view-empty").hidden = true;
  const generation = state.generation;
  refreshView(generation);
}

function closeView() {
  state.generation += 1;
  clearTimeout(state.viewTimer);
  state.open = null;
  state.view = null;
  state.formFilled = false;
  $("view-title").textContent = "No SKU open";
  $("view-empty").hidden = false;
  $("view-body").hidden = true;
  for (const id of ["view-outcome", "action-outcome"]) {
    say(id, "", "");
  }
}

/** One refresh of the live view; then the next, until the SKU changes. */
async function refreshView(generation) {
  const { tenant, sku } = state.open;
  try {
    const view = await api("GET", skuPath(tenant, sku));
    if (generation !== state.generation) {
      return;
    }
    renderView(view);
    say("view-outcome", "", "");
  } catch (error) {
    if (generation !== state.generation) {
      return;
    }
    const text =
      error instanceof Refused && error.status === 404
        ? `${tenant}/${sku} does not exist (404 UNKNOWN_SKU).`
        : explain(error);
    // The last view read stays on screen, marked as old by its time.
    say("view-outcome", "error", text);
  }
  if (generation === state.generation && state.token) {
    state.viewTimer = setTimeout(() => refreshView(generation), VIEW_REFRESH_MS);
  }
}

/** The sums over regions of their last reports. */
function sums(view) {
  const total = { available: 0, held: 0, sold: 0 };
  for (const region of Object.values(view.regions)) {
    total.available += region.available;
    total.held += region.held;
    total.sold += region.sold;
  }
  return total;
}

/**
 * The SKU's sale rate: the sum of the rates its regions last reported
 * (units held per second), or null while no region has reported one.
 */
function saleRate(view) {
  const rates = Object.values(view.regions)
    .map((region) => region.sale_rate_per_s)
    .filter((rate) => rate !== null && rate !== undefined);
  return rates.length === 0 ? null : rates.reduce((sum, rate) => sum + rate, 0);
}

function renderView(view) {
  const now = Date.now();
  const { available, held, sold } = sums(view);
  const rate = saleRate(view);
  state.view = view;

  $("view-body").hidden = false;
  const stateBadge = $("sku-state");
  stateBadge.textContent = view.paused ? "Paused" : "Selling";
  stateBadge.className = `badge ${view.paused ? "paused" : "selling"}`;
  const soldOut = available + view.pool + view.in_transit === 0;
  $("sku-sold-out").hidden = !soldOut;
  $("sku-mode").textContent = view.mode;
  $("sku-policy").textContent = view.policy + (view.policy_is_default ? " (the default)" : "");
  $("sku-user-limit").textContent = `${view.max_per_user}, ` +
    (view.user_limit_scope === "global" ? "across all regions" : "in each region");
  $("sku-updated").textContent = `Read at ${new Date(now).toLocaleTimeString()}`;

  $("sku-total").textContent = view.total;
  $("sku-sold").textContent = sold;
  $("sku-held").textContent = held;
  $("sku-available").textContent = available;
  $("sku-pool").textContent = view.pool;
  $("sku-in-transit").textContent = view.in_transit;
  $("sku-rate").textContent = rate === null ? "–" : rate.toFixed(2);
  showDrift("sku-drift", view.drift);
  showDrift("sku-ledger-drift", view.ledger_drift);

  const regions = Object.entries(view.regions).map(([name, region]) =>
    renderRegion(name, region, view.total),
  );
  $("regions").replaceChildren(...regions);

  const toggle = $("pause-toggle");
  toggle.textContent = view.paused ? "Resume sales" : "Pause sales";
  if (!state.formFilled) {
    fillChangeForm(view);
  }
}

/** A drift: 0 is right, anything else is marked and says so in words. */
function showDrift(id, drift) {
  const element = $(id);
  element.textContent = drift === 0 ? "0" : `${drift} (must be 0)`;
  element.className = drift === 0 ? "good" : "bad";
}

/** One region: its facts in words, and available, held and sold as bars out of `scale`. */
function renderRegion(name, region, scale) {
  const box = document.createElement("section");
  box.className = "region";
  box.dataset.region = name;
  box.setAttribute("aria-label", `Region ${name}`);

  const title = document.createElement("h4");
  title.textContent = name;
  if (region.stale) {
    const stale = document.createElement("span");
    stale.className = "badge bad";
    stale.textContent = "Stale report";
    title.append(" ", stale);
  }
  box.append(title);

  const age = region.report_age_ms === null ? "no report yet" : `report ${region.report_age_ms} ms old`;
  const rate =
    region.sale_rate_per_s === null || region.sale_rate_per_s === undefined
      ? "–"
      : `${region.sale_rate_per_s.toFixed(2)} units/s`;
  const facts = document.createElement("p");
  facts.className = "facts";
  facts.textContent =
    `weight ${region.weight} · leased ${region.leased} · in transit ${region.in_transit}` +
    ` · recall pending ${region.recall_pending} · sales ${rate} · ${age}` +
    ` · drift ${region.region_drift}`;
  box.append(facts);

  for (const [kind, label] of [["available", "Available"], ["held", "Held"], ["sold", "Sold"]]) {
    const row = document.createElement("div");
    row.className = `bar-row ${kind}`;
    const text = document.createElement("span");
    text.className = "bar-label";
    text.textContent = label;
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.setAttribute("aria-hidden", "true");
    const fill = document.createElement("span");
    fill.className = "fill";
    const share = scale > 0 ? Math.min(1, Math.max(0, region[kind] / scale)) : 0;
    fill.style.width = `${(share * 100).toFixed(1)}%`;
    bar.append(fill);
    const value = document.createElement("span");
    value.className = "bar-value";
    value.textContent = region[kind];
    row.append(text, bar, value);
    box.append(row);
  }
  return box;
}

/** `eu=1, us=1` for the view's regions. */
function weightsText(view) {
  return Object.entries(view.regions)
    .map(([name, region]) => `${name}=${region.weight}`)
    .join(", ");
}

function fillChangeForm(view) {
  $("change-total").value = view.total;
  $("change-weights").value = weightsText(view);
  state.formFilled = true;
}

/** `eu=2, us=1` as `{eu: 2, us: 1}`; throws a sentence saying what is wrong. */
function parseWeights(text) {
  const weights = {};
  for (const part of text.split(/[\s,]+/).filter((p) => p !== "")) {
    const match = /^([a-z0-9-]{1,32})=(\d{1,7})$/.exec(part);
    if (!match) {
      throw new Error(
        `"${part}" is not REGION=WEIGHT (a region of a-z, 0-9 and -, a whole number weight)`,
      );
    }
    weights[match[1]] = Number(match[2]);
  }
  if (Object.keys(weights).length === 0) {
    throw new Error("name at least one region, as eu=1");
  }
  return weights;
}

// ---- Actions ----------------------------------------------------------

/** Runs `action` once at a time, showing its outcome in `outcomeId`. */
async function act(outcomeId, action) {
  if (state.busy) {
    return;
  }
  state.busy = true;
  say(outcomeId, "", "Sending…");
  try {
    say(outcomeId, "ok", await action());
  } catch (error) {
    if (error instanceof Refused || error instanceof Unreachable) {
      say(outcomeId, "error", explain(error));
    } else {
      say(outcomeId, "error", error.message);
    }
  } finally {
    state.busy = false;
  }
}

/** A change the coordinator accepted: show its answer at once. */
function applied(view) {
  if (state.open && view.tenant === state.open.tenant && view.sku === state.open.sku) {
    renderView(view);
    fillChangeForm(view);
  }
  refreshList();
}

async function createSku(event) {
  event.preventDefault();
  await act("create-outcome", async () => {
    const tenant = $("create-tenant").value.trim();
    const sku = $("create-sku").value.trim();
    const body = {
      total: Number($("create-total").value),
      regions: parseWeights($("create-weights").value),
    };
    if ($("create-policy").value) {
      body.policy = $("create-policy").value;
    }
    // PUT also changes an existing SKU: creating must not.
    try {
      await api("GET", skuPath(tenant, sku));
      throw new Error(`${tenant}/${sku} exists already: open it to change it.`);
    } catch (error) {
      if (!(error instanceof Refused && error.status === 404)) {
        throw error;
      }
    }
    const view = await api("PUT", skuPath(tenant, sku), body);
    $("create-form").reset();
    refreshList();
    location.hash = `#/sku/${encodeURIComponent(tenant)}/${encodeURIComponent(sku)}`;
    return `Created ${view.tenant}/${view.sku}: ${view.total} units, policy ${view.policy}.`;
  });
}

async function togglePause() {
  const { tenant, sku } = state.open;
  const paused = state.view ? state.view.paused : false;
  await act("action-outcome", async () => {
    const view = await api("POST", skuPath(tenant, sku, paused ? "/resume" : "/pause"));
    applied(view);
    return view.paused
      ? `Paused ${tenant}/${sku}: each region stops new holds at its next sync.`
      : `Resumed ${tenant}/${sku}.`;
  });
}

async function addStock(event) {
  event.preventDefault();
  const { tenant, sku } = state.open;
  await act("action-outcome", async () => {
    const qty = Number($("stock-qty").value);
    const view = await api("POST", skuPath(tenant, sku, "/add-stock"), { qty });
    $("stock-qty").value = "";
    applied(view);
    return `Added ${qty} units to ${tenant}/${sku}: the total is ${view.total}.`;
  });
}

async function changeSku(event) {
  event.preventDefault();
  const { tenant, sku } = state.open;
  await act("action-outcome", async () => {
    const body = {
      total: Number($("change-total").value),
      regions: parseWeights($("change-weights").value),
    };
    const view = await api("PUT", skuPath(tenant, sku), body);
    applied(view);
    return `Changed ${tenant}/${sku}: total ${view.total}, weights ${weightsText(view)}.`;
  });
}

// ---- Wiring -----------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value, true);
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("next-page").addEventListener("click", () => {
    state.after = state.next;
    refreshList();
  });
  $("first-page").addEventListener("click", () => {
    state.after = null;
    refreshList();
  });
  $("create-form").addEventListener("submit", createSku);
  $("pause-toggle").addEventListener("click", togglePause);
  $("stock-form").addEventListener("submit", addStock);
  $("change-form").addEventListener("submit", changeSku);
  window.addEventListener("hashchange", () => {
    if (state.token) {
      route(true);
    }
  });
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) {
    signIn(token, false);
  } else {
    $("token").focus();
  }
});
