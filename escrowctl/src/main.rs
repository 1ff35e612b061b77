//! `escrowctl`: the admin CLI for the coordinator (and standalone agents).
//!
//! Every subcommand is one admin API call (`sku list` one per page, until
//! the last); output is a table for people or the API's JSON with `--json`.
//! `audit` exits 1 when any SKU drifts or a region's report is stale, so it
//! can gate a deploy or page someone. `completions` prints a shell's
//! completion script and calls nothing. `cart show` asks a region agent
//! (`--region`), where carts live. `sku watch` reads a SKU's view
//! again and again and shows it live ([`watch`]).

mod watch;

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{CommandFactory, Parser, Subcommand};
use clap_complete::Shell;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::{json, Value};

/// Admin CLI for the regional quota allocator.
#[derive(Debug, Parser)]
#[command(name = "escrowctl", version)]
struct Cli {
    /// Coordinator (or standalone agent) base URL.
    #[arg(
        long,
        env = "ESCROW_URL",
        default_value = "http://127.0.0.1:7000",
        global = true
    )]
    url: String,
    /// Admin bearer token.
    #[arg(
        long,
        env = "ESCROW_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Idempotency-Key of a change (put, add-stock, pause, resume): run
    /// the same command again with the same key and it is applied once.
    #[arg(long, global = true)]
    idempotency_key: Option<String>,
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
    /// Create, change and inspect SKUs.
    Sku {
        #[command(subcommand)]
        command: SkuCommand,
    },
    /// Look up carts at a region agent.
    Cart {
        #[command(subcommand)]
        command: CartCommand,
    },
    /// The invariant for every SKU; exit status 1 on any drift or stale report.
    Audit,
    /// Region agents and their last sync.
    Regions,
    /// Delete what ended more than --older-than-s ago: at the coordinator
    /// delivered grants and admin idempotency keys, at a region agent
    /// released and expired reservations (their keys may then be reused)
    /// and confirmed grants. Sales are kept. Runs in short batches, safe
    /// during a sale.
    Prune {
        /// The retention window, seconds (at least 60); e.g. 86400 for a day.
        #[arg(long)]
        older_than_s: u64,
    },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell), e.g. `escrowctl completions bash > /etc/bash_completion.d/escrowctl`.
    Completions {
        /// The shell to complete in.
        shell: Shell,
    },
}

#[derive(Debug, Subcommand)]
enum SkuCommand {
    #[command(flatten)]
    Call(SkuCall),
    /// Show the SKU live, refreshed every interval, until q, Esc or Ctrl-C.
    ///
    /// Per region: available/held/sold bars, sale rate and report age; the
    /// pool, units in transit, mode, paused, drift and sales per second.
    /// One plain line per refresh when stdout is not a terminal (or with
    /// --plain, --once or --json); a coordinator that does not answer is
    /// retried at every refresh.
    Watch {
        /// TENANT/SKU.
        id: String,
        /// Time between refreshes, in ms (100..=3600000).
        #[arg(long, default_value_t = 1000,
              value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        interval_ms: u64,
        /// One plain line per refresh, even on a terminal.
        #[arg(long)]
        plain: bool,
        /// Print one refresh and exit.
        #[arg(long)]
        once: bool,
    },
}

#[derive(Debug, Subcommand)]
enum CartCommand {
    /// A cart as its region agent committed it: status, expiry, items.
    Show {
        /// TENANT/KEY: the cart's tenant and request key.
        id: String,
        /// The region agent holding the cart (carts live in the region
        /// that held them; default: --url).
        #[arg(long)]
        region: Option<String>,
    },
}

/// The `sku` subcommands that are one API call (`list` one per page).
#[derive(Debug, Subcommand)]
enum SkuCall {
    /// Create a SKU or change its total and settings.
    Put {
        /// TENANT/SKU.
        id: String,
        /// Units in all.
        #[arg(long)]
        total: u64,
        /// Region weights, e.g. `eu=2,us=1`.
        #[arg(long, value_delimiter = ',')]
        regions: Vec<String>,
        /// Units per reservation at most.
        #[arg(long)]
        max_per_user: Option<u32>,
        /// Default hold duration in ms.
        #[arg(long)]
        hold_ttl_ms: Option<u64>,
        /// Whose rows the per-user limit counts: each region's own
        /// (`region`, the default) or all regions' together (`global`);
        /// chosen when the SKU is created.
        #[arg(long, value_parser = ["region", "global"])]
        user_limit_scope: Option<String>,
        /// Rebalancing policy: tail-merge, refill, proportional, static or
        /// central (default: the coordinator's `--policy`).
        #[arg(long)]
        policy: Option<String>,
        /// A policy setting, `KEY=VALUE`, repeatable; nested keys are
        /// dotted (`refill.low_water_s=2`); VALUE is JSON, else a string.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Every SKU of TENANT (of every tenant without it), one line each:
    /// totals, the regions' summed counters, mode, paused.
    List {
        /// Only this tenant's SKUs.
        tenant: Option<String>,
        /// SKUs per request, 1..=1000 (default: the coordinator's, 100);
        /// every page is read.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Totals, pool, in transit and every region's counters.
    Show {
        /// TENANT/SKU.
        id: String,
    },
    /// Stop selling everywhere.
    Pause {
        /// TENANT/SKU.
        id: String,
    },
    /// Resume selling.
    Resume {
        /// TENANT/SKU.
        id: String,
    },
    /// Add units to the pool.
    AddStock {
        /// TENANT/SKU.
        id: String,
        /// Units to add.
        qty: u64,
    },
}

fn cart_path(id: &str) -> anyhow::Result<String> {
    let (tenant, key) = id.split_once('/').context("expected TENANT/KEY")?;
    if tenant.is_empty() || key.is_empty() || key.contains('/') {
        bail!("expected TENANT/KEY");
    }
    Ok(format!("/v1/admin/carts/{tenant}/{key}"))
}

fn cart_table(cart: &Value) -> String {
    let mut head = Table::new();
    head.load_preset(UTF8_FULL_CONDENSED);
    head.set_header(["cart", "user", "status", "expires at", "region"]);
    head.add_row([
        cell(&cart["request_key"]),
        cell(&cart["user_id"]),
        cell(&cart["status"]),
        cell(&cart["expires_at"]),
        cell(&cart["region"]),
    ]);
    let mut items = Table::new();
    items.load_preset(UTF8_FULL_CONDENSED);
    items.set_header(["sku", "qty"]);
    for item in cart["items"].as_array().into_iter().flatten() {
        items.add_row([cell(&item["sku"]), cell(&item["qty"])]);
    }
    format!("{head}\n{items}")
}

fn sku_path(id: &str) -> anyhow::Result<String> {
    let (tenant, sku) = id.split_once('/').context("expected TENANT/SKU")?;
    if tenant.is_empty() || sku.is_empty() || sku.contains('/') {
        bail!("expected TENANT/SKU");
    }
    Ok(format!("/v1/admin/skus/{tenant}/{sku}"))
}

/// Policy settings from `KEY=VALUE` pairs, nested by the key's dots.
fn settings(raw: &[String]) -> anyhow::Result<Option<Value>> {
    if raw.is_empty() {
        return Ok(None);
    }
    let mut root = json!({});
    for pair in raw {
        let (key, value) = pair.split_once('=').context("expected KEY=VALUE")?;
        let value = serde_json::from_str(value).unwrap_or_else(|_| json!(value));
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts
            .pop()
            .filter(|k| !k.is_empty())
            .context("empty setting name")?;
        let mut node = &mut root;
        for part in parts {
            node = node
                .as_object_mut()
                .with_context(|| format!("{key}: {part} is also set as a value"))?
                .entry(part)
                .or_insert_with(|| json!({}));
        }
        node.as_object_mut()
            .with_context(|| format!("{key}: a parent is also set as a value"))?
            .insert(last.to_owned(), value);
    }
    Ok(Some(root))
}

fn weights(raw: &[String]) -> anyhow::Result<Option<Value>> {
    if raw.is_empty() {
        return Ok(None);
    }
    let mut map = serde_json::Map::new();
    for pair in raw {
        let (region, weight) = pair.split_once('=').context("expected REGION=WEIGHT")?;
        let weight: u64 = weight
            .parse()
            .with_context(|| format!("weight of {region}"))?;
        map.insert(region.to_owned(), json!(weight));
    }
    Ok(Some(Value::Object(map)))
}

/// A non-2xx answer: its status and body.
#[derive(Debug)]
struct Refused {
    status: reqwest::StatusCode,
    body: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.body)
    }
}

impl std::error::Error for Refused {}

struct Api {
    url: String,
    token: Option<String>,
    idempotency_key: Option<String>,
    client: reqwest::Client,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        self.request(method, path, &[], body).await
    }

    /// `method path?query` with `body`; the answer's JSON, or an error
    /// naming the status and body of any non-2xx answer.
    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let change = method != reqwest::Method::GET;
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.url.trim_end_matches('/')))
            .query(query);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let (Some(key), true) = (&self.idempotency_key, change) {
            req = req.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req
            .send()
            .await
            .with_context(|| format!("calling {}", self.url))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(Refused { status, body: text }.into());
        }
        serde_json::from_str(&text).context("the server's answer is not JSON")
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn sku_table(sku: &Value) -> String {
    let mut head = Table::new();
    head.load_preset(UTF8_FULL_CONDENSED);
    head.set_header([
        "tenant/sku",
        "total",
        "pool",
        "in transit",
        "mode",
        "policy",
        "per user",
        "paused",
        "drift",
    ]);
    head.add_row([
        format!("{}/{}", cell(&sku["tenant"]), cell(&sku["sku"])),
        cell(&sku["total"]),
        cell(&sku["pool"]),
        cell(&sku["in_transit"]),
        cell(&sku["mode"]),
        cell(&sku["policy"]),
        format!(
            "{} ({})",
            cell(&sku["max_per_user"]),
            cell(&sku["user_limit_scope"])
        ),
        cell(&sku["paused"]),
        cell(&sku["drift"]),
    ]);
    let mut regions = Table::new();
    regions.load_preset(UTF8_FULL_CONDENSED);
    regions.set_header([
        "region",
        "weight",
        "leased",
        "available",
        "held",
        "sold",
        "report age ms",
        "stale",
    ]);
    if let Some(map) = sku["regions"].as_object() {
        for (name, r) in map {
            regions.add_row([
                name.clone(),
                cell(&r["weight"]),
                cell(&r["leased"]),
                cell(&r["available"]),
                cell(&r["held"]),
                cell(&r["sold"]),
                cell(&r["report_age_ms"]),
                cell(&r["stale"]),
            ]);
        }
    }
    format!("{head}\n{regions}")
}

/// Every SKU of `tenant` (of every tenant with `None`), reading the
/// listing's pages of `limit` SKUs until the last: the answer a single page
/// holding them all would be, `{"skus": [...], "next": null}`.
async fn list(api: &Api, tenant: Option<&str>, limit: Option<u32>) -> anyhow::Result<Value> {
    let path = match tenant {
        Some(tenant) if tenant.is_empty() || tenant.contains('/') => {
            bail!("expected TENANT, without /SKU")
        }
        Some(tenant) => format!("/v1/admin/skus/{tenant}"),
        None => "/v1/admin/skus".to_owned(),
    };
    let mut skus = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = Vec::new();
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        if let Some(after) = &after {
            query.push(("after", after.clone()));
        }
        let page = api
            .request(reqwest::Method::GET, &path, &query, None)
            .await?;
        let lines = page["skus"]
            .as_array()
            .context("the server's page has no skus")?;
        skus.extend(lines.iter().cloned());
        match &page["next"] {
            Value::Null => break,
            // A page that does not move the cursor would be read forever.
            Value::String(next) if !lines.is_empty() && after.as_ref() != Some(next) => {
                after = Some(next.clone());
            }
            next => bail!("the server's next page ({next}) does not follow its last"),
        }
    }
    Ok(json!({"skus": skus, "next": null}))
}

fn list_table(answer: &Value) -> String {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "tenant/sku",
        "total",
        "sold",
        "held",
        "available",
        "pool",
        "in transit",
        "mode",
        "paused",
    ]);
    for sku in answer["skus"].as_array().into_iter().flatten() {
        table.add_row([
            format!("{}/{}", cell(&sku["tenant"]), cell(&sku["sku"])),
            cell(&sku["total"]),
            cell(&sku["sold"]),
            cell(&sku["held"]),
            cell(&sku["available"]),
            cell(&sku["pool"]),
            cell(&sku["in_transit"]),
            cell(&sku["mode"]),
            cell(&sku["paused"]),
        ]);
    }
    table.to_string()
}

/// One `sku` subcommand: the API's answer and its table.
async fn sku(api: &Api, command: SkuCall) -> anyhow::Result<(Value, String)> {
    use reqwest::Method;
    let answer = match command {
        SkuCall::Put {
            id,
            total,
            regions,
            max_per_user,
            hold_ttl_ms,
            user_limit_scope,
            policy,
            settings: set,
        } => {
            let mut body = json!({"total": total});
            if let Some(w) = weights(&regions)? {
                body["regions"] = w;
            }
            if let Some(m) = max_per_user {
                body["max_per_user"] = json!(m);
            }
            if let Some(t) = hold_ttl_ms {
                body["hold_ttl_ms"] = json!(t);
            }
            if let Some(scope) = user_limit_scope {
                body["user_limit_scope"] = json!(scope);
            }
            if let Some(p) = policy {
                body["policy"] = json!(p);
            }
            if let Some(s) = settings(&set)? {
                body["settings"] = s;
            }
            api.call(Method::PUT, &sku_path(&id)?, Some(body)).await?
        }
        SkuCall::List { tenant, limit } => {
            let answer = list(api, tenant.as_deref(), limit).await?;
            let human = list_table(&answer);
            return Ok((answer, human));
        }
        SkuCall::Show { id } => api.call(Method::GET, &sku_path(&id)?, None).await?,
        SkuCall::Pause { id } => {
            api.call(Method::POST, &format!("{}/pause", sku_path(&id)?), None)
                .await?
        }
        SkuCall::Resume { id } => {
            api.call(Method::POST, &format!("{}/resume", sku_path(&id)?), None)
                .await?
        }
        SkuCall::AddStock { id, qty } => {
            api.call(
                Method::POST,
                &format!("{}/add-stock", sku_path(&id)?),
                Some(json!({"qty": qty})),
            )
            .await?
        }
    };
    let human = sku_table(&answer);
    Ok((answer, human))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let api = Api {
        url: cli.url,
        token: cli.token,
        idempotency_key: cli.idempotency_key,
        client: reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()?,
    };
    use reqwest::Method;
    let (answer, human) = match cli.command {
        Top::Sku {
            command:
                SkuCommand::Watch {
                    id,
                    interval_ms,
                    plain,
                    once,
                },
        } => {
            let output = watch::Output {
                plain,
                once,
                json: cli.json,
            };
            let interval = std::time::Duration::from_millis(interval_ms);
            return watch::run(&api, &id, &sku_path(&id)?, interval, output).await;
        }
        Top::Sku {
            command: SkuCommand::Call(call),
        } => sku(&api, call).await?,
        Top::Cart {
            command: CartCommand::Show { id, region },
        } => {
            let at = Api {
                url: region.unwrap_or_else(|| api.url.clone()),
                ..api
            };
            let answer = at.call(Method::GET, &cart_path(&id)?, None).await?;
            let human = cart_table(&answer);
            (answer, human)
        }
        Top::Audit => {
            let answer = api.call(Method::GET, "/v1/admin/audit", None).await?;
            let skus = answer["skus"].as_array().cloned().unwrap_or_default();
            let human = skus.iter().map(sku_table).collect::<Vec<_>>().join("\n");
            let drift = answer["drift_total"].as_i64().unwrap_or(1) != 0;
            let stale = skus.iter().any(|s| s["stale"] == true);
            let verdict = match (drift, stale) {
                (false, false) => "audit: OK, drift 0 everywhere".to_owned(),
                _ => format!(
                    "audit: FAILED (drift_total {}, stale reports: {stale})",
                    answer["drift_total"]
                ),
            };
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                println!("{human}\n{verdict}");
            }
            return Ok(if drift || stale {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
        Top::Regions => {
            let answer = api.call(Method::GET, "/v1/admin/regions", None).await?;
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header([
                "region",
                "epoch",
                "seq",
                "rtt ms",
                "last sync",
                "sync age ms",
            ]);
            for r in answer["regions"].as_array().cloned().unwrap_or_default() {
                table.add_row([
                    cell(&r["region"]),
                    cell(&r["epoch"]),
                    cell(&r["seq"]),
                    cell(&r["rtt_ms"]),
                    cell(&r["last_sync_at"]),
                    cell(&r["sync_age_ms"]),
                ]);
            }
            (answer, table.to_string())
        }
        Top::Prune { older_than_s } => {
            let body = serde_json::json!({"older_than_s": older_than_s});
            let answer = api
                .call(Method::POST, "/v1/admin/prune", Some(body))
                .await?;
            let counts = answer
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(what, n)| format!("{what} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            (answer, format!("pruned: {counts}"))
        }
        Top::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "escrowctl",
                &mut std::io::stdout(),
            );
            return Ok(ExitCode::SUCCESS);
        }
    };
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        println!("{human}");
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("escrowctl: {error:#}");
            ExitCode::from(2)
        }
    }
}
