//! The deployment artifacts against the real binaries: the alert rules and
//! the dashboard parse and read only metrics the services export after a
//! small sale; every rule names its runbook section; the systemd units keep
//! secrets off the command line and set only variables the binaries read.
//! `promtool` and `systemd-analyze` check the files where they are
//! installed; each check that cannot run says so on stderr, or fails
//! under `ESCROW_REQUIRE_TOOLS=1`.
//! Runs the real binaries (`cargo build --workspace --bins` first).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use deploy::{metric_names, Exposition};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use test_support::{
    binary, eventually, free_port, on_both_backends, service, wait_ready, Api, Proc, TestDb,
    ACME_KEY,
};

/// The SKU every sale sells.
const SKU: &str = "drop";

/// Metrics only an agent under a coordinator records: a standalone agent
/// never syncs.
const COORDINATED_ONLY: [&str; 2] = ["escrow_syncs_total", "escrow_coordinator_down"];

/// Flags whose value is a secret, which a unit must not pass: `ps` shows
/// every process's command line to every user.
const SECRET_FLAGS: [&str; 5] = [
    "--admin-token",
    "--region-token",
    "--tenant-key",
    "--database-url",
    "--token",
];

/// The environment variables of those flags, which only the 0600 env
/// files may set.
const SECRET_VARS: [&str; 5] = [
    "ESCROW_ADMIN_TOKEN",
    "ESCROW_REGION_TOKEN",
    "ESCROW_REGION_TOKENS",
    "ESCROW_TENANT_KEYS",
    "DATABASE_URL",
];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = deploy_dir().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs an external checker, or says it skipped it when the tool is not
/// installed (a failure under `ESCROW_REQUIRE_TOOLS=1`); with the tool,
/// the check must pass.
fn run_tool(tool: &str, args: &[&str], cwd: &Path) -> Option<Output> {
    match Command::new(tool).args(args).current_dir(cwd).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let files: Vec<_> = args
                .iter()
                .map(|a| Path::new(a).file_name().unwrap().to_string_lossy())
                .collect();
            test_support::tools::skip_without(
                &format!("`{tool}` on PATH"),
                &format!("`{tool} {}`", files.join(" ")),
            );
            None
        }
        Err(e) => panic!("{tool}: {e}"),
    }
}

fn assert_tool_passes(tool: &str, args: &[&str], cwd: &Path) {
    if let Some(out) = run_tool(tool, args, cwd) {
        assert!(
            out.status.success(),
            "`{tool} {}` failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------
// The files and the queries in them.

/// A Prometheus rule file, as far as alerting rules go.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<AlertRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertRule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    pending: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn alert_rules() -> Vec<AlertRule> {
    let file: RuleFile = serde_yaml_ng::from_str(&read("prometheus/alerts.yml")).unwrap();
    let mut names = BTreeSet::new();
    for group in &file.groups {
        assert!(names.insert(&group.name), "group {} twice", group.name);
    }
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/sale-dashboard.json")).unwrap()
}

/// Every query of the dashboard (panel targets, variables, annotations),
/// with the title or name of what holds it.
fn dashboard_queries() -> Vec<(String, String)> {
    fn walk(value: &Value, place: &str, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(fields) => {
                let place = fields
                    .get("title")
                    .or_else(|| fields.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or(place);
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("expr" | "query" | "definition", Value::String(q)) => {
                            found.push((place.to_owned(), q.clone()));
                        }
                        _ => walk(field, place, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, place, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&dashboard(), "dashboard", &mut found);
    found
}

/// Every service metric the rules and the dashboard read, with where.
fn referenced() -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let rules = alert_rules()
        .into_iter()
        .map(|r| (format!("alert {}", r.alert), r.expr));
    let panels = dashboard_queries()
        .into_iter()
        .map(|(place, q)| (format!("dashboard '{place}'"), q));
    for (place, query) in rules.chain(panels) {
        for name in metric_names(&query) {
            names.entry(name).or_default().insert(place.clone());
        }
    }
    names
}

/// The anchors GitHub gives the headings of a Markdown file, with each
/// heading's level.
fn headings(markdown: &str) -> Vec<(usize, String)> {
    markdown
        .lines()
        .filter_map(|line| {
            let level = line.chars().take_while(|c| *c == '#').count();
            let text = line.get(level..)?.strip_prefix(' ')?;
            let anchor = text
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            (level > 0).then_some((level, anchor))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The files alone.

/// Goal: the alert rules parse, each has a severity, a `summary` and a
/// `runbook` naming its own section of the runbook, and that section lists
/// exactly these alerts; promtool, where installed, checks and unit-tests
/// the rules and the example configuration.
#[test]
fn alert_rules_parse_and_each_names_its_runbook_section() {
    let rules = alert_rules();
    assert!(!rules.is_empty());
    let mut alerts = BTreeSet::new();
    for rule in &rules {
        assert!(
            alerts.insert(rule.alert.to_lowercase()),
            "{} twice",
            rule.alert
        );
        assert!(!rule.expr.trim().is_empty(), "{}: empty expr", rule.alert);
        assert!(
            matches!(
                rule.labels.get("severity").map(String::as_str),
                Some("page" | "warning")
            ),
            "{}: severity page or warning",
            rule.alert
        );
        if let Some(pending) = &rule.pending {
            let unit = pending.trim_start_matches(|c: char| c.is_ascii_digit());
            assert!(
                unit.len() < pending.len() && matches!(unit, "ms" | "s" | "m" | "h"),
                "{}: for: {pending}",
                rule.alert
            );
        }
        let summary = rule.annotations.get("summary");
        assert!(
            summary.is_some_and(|s| !s.is_empty()),
            "{}: no summary",
            rule.alert
        );
        let runbook = rule.annotations.get("runbook");
        assert_eq!(
            runbook.map(String::as_str),
            Some(format!("docs/operations.md#{}", rule.alert.to_lowercase()).as_str()),
            "{}: runbook",
            rule.alert
        );
    }
    // The runbook's "Alerts" section has one subsection per alert, no more.
    let doc = std::fs::read_to_string(deploy_dir().join("../docs/operations.md")).unwrap();
    let headings = headings(&doc);
    let start = headings
        .iter()
        .position(|(level, anchor)| *level == 2 && anchor == "sale-day-runbook")
        .expect("docs/operations.md has a Sale day runbook");
    let alerts_at = start
        + headings[start..]
            .iter()
            .position(|(level, anchor)| *level == 3 && anchor == "alerts")
            .expect("the runbook has an Alerts section");
    let sections: BTreeSet<String> = headings[alerts_at + 1..]
        .iter()
        .take_while(|(level, _)| *level > 3)
        .filter(|(level, _)| *level == 4)
        .map(|(_, anchor)| anchor.clone())
        .collect();
    assert_eq!(sections, alerts, "runbook sections vs alerts");

    let dir = deploy_dir().join("prometheus");
    assert_tool_passes("promtool", &["check", "rules", "alerts.yml"], &dir);
    assert_tool_passes("promtool", &["check", "config", "prometheus.yml"], &dir);
    assert_tool_passes("promtool", &["test", "rules", "alerts.test.yml"], &dir);
}

/// Goal: the dashboard parses, asks for its Prometheus data source as a
/// variable and uses it in every panel and query, lays its panels out on
/// Grafana's 24-column grid with distinct ids, and every query parses as
/// PromQL (promtool, where installed, with the variables filled in).
#[test]
fn dashboard_parses_and_every_panel_queries_the_chosen_datasource() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(datasource["query"], "prometheus");
    let chosen = format!("${{{}}}", datasource["name"].as_str().unwrap());
    // Every Prometheus query anywhere (panels, variables, annotations) goes
    // to the chosen data source, never to one of the author's.
    fn prometheus_uids<'a>(value: &'a Value, found: &mut Vec<&'a Value>) {
        match value {
            Value::Object(fields) => {
                if let Some(source) = fields.get("datasource") {
                    if source["type"] == "prometheus" {
                        found.push(&source["uid"]);
                    }
                }
                fields.values().for_each(|v| prometheus_uids(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| prometheus_uids(v, found)),
            _ => {}
        }
    }
    let mut uids = Vec::new();
    prometheus_uids(&dashboard, &mut uids);
    assert!(uids.iter().all(|uid| **uid == chosen), "{uids:?}");
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(variable["datasource"]["uid"], chosen, "{variable}");
    }
    let mut ids = BTreeSet::new();
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "{title}: id");
        let grid = &panel["gridPos"];
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{title}: wider than the grid"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], chosen, "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for target in targets {
            assert_eq!(target["datasource"]["uid"], chosen, "{title}");
            assert!(
                refs.insert(target["refId"].as_str().unwrap()),
                "{title}: refId"
            );
            let expr = target["expr"].as_str().unwrap();
            assert!(
                !metric_names(expr).is_empty() || expr.starts_with("up{"),
                "{title}: {expr} reads none of the services' metrics"
            );
        }
    }

    // promtool has no bare expression check: the queries become recording
    // rules, Grafana's variables replaced by values of their kind.
    let fill = |query: &str| {
        let mut out = String::new();
        let mut rest = query;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = rest[at + 1..].trim_start_matches('{');
            let name_len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..name_len];
            out.push_str(if name.starts_with("__") { "1m" } else { ".*" });
            rest = after[name_len..].trim_start_matches('}');
        }
        out + rest
    };
    let rules: Vec<Value> = dashboard_queries()
        .into_iter()
        .filter(|(_, q)| !metric_names(q).is_empty() && !q.starts_with("label_values("))
        .enumerate()
        .map(|(i, (_, q))| json!({"record": format!("dashboard:query_{i}"), "expr": fill(&q)}))
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = scratch_dir("dashboard-rules");
    std::fs::write(dir.join("dashboard.yml"), file.to_string()).unwrap();
    assert_tool_passes("promtool", &["check", "rules", "dashboard.yml"], &dir);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A unit file's `Key=Value` lines by section, in order.
fn unit_settings(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut settings = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some((key, value)) = line.split_once('=') {
            settings.push((section.clone(), key.to_owned(), value.to_owned()));
        }
    }
    settings
}

/// The environment variables a binary reads, from its `--help`.
fn env_names(binary_name: &str) -> BTreeSet<String> {
    let out = Command::new(binary(binary_name))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.split("[env: ")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

/// Goal: the systemd units take every secret from an env file, never from
/// the command line, and are hardened; the env examples set only variables
/// their binary reads, with placeholders for every secret;
/// `systemd-analyze verify`, where installed, accepts the units.
#[test]
fn units_keep_secrets_in_env_files_and_verify() {
    let systemd = deploy_dir().join("systemd");
    let mut files: Vec<String> = std::fs::read_dir(&systemd)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let units: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".service") || f.ends_with(".timer"))
        .collect();
    for name in ["coordinator.service", "region-agent@.service"] {
        assert!(units.iter().any(|u| *u == name), "{name} missing");
    }
    let bin_dir = binary("coordinator").parent().unwrap().to_owned();
    let scratch = scratch_dir("units");
    for unit in &units {
        let text = std::fs::read_to_string(systemd.join(unit)).unwrap();
        let settings = unit_settings(&text);
        let get = |key: &str| -> Vec<&str> {
            settings
                .iter()
                .filter(|(section, k, _)| section == "Service" && k == key)
                .map(|(_, _, v)| v.as_str())
                .collect()
        };
        if unit.ends_with(".service") {
            let exec = get("ExecStart");
            assert_eq!(exec.len(), 1, "{unit}: one ExecStart");
            let program = exec[0].split_whitespace().next().unwrap();
            let program = program
                .strip_prefix("/usr/local/bin/")
                .unwrap_or_else(|| panic!("{unit}: ExecStart in /usr/local/bin"));
            assert!(
                bin_dir.join(program).exists(),
                "{unit}: no binary {program}"
            );
            for flag in SECRET_FLAGS {
                assert!(
                    !exec[0].split_whitespace().any(|w| w.starts_with(flag)),
                    "{unit}: {flag} on the command line"
                );
            }
            for value in get("Environment") {
                assert!(
                    !SECRET_VARS.iter().any(|v| value.contains(v)),
                    "{unit}: a secret in Environment={value}"
                );
            }
            assert!(
                !get("EnvironmentFile").is_empty(),
                "{unit}: EnvironmentFile"
            );
            for (key, value) in [
                ("DynamicUser", "yes"),
                ("NoNewPrivileges", "yes"),
                ("ProtectSystem", "strict"),
                ("ProtectHome", "yes"),
                ("PrivateTmp", "yes"),
                ("CapabilityBoundingSet", ""),
            ] {
                assert_eq!(get(key), [value], "{unit}: {key}");
            }
            if get("Type") != ["oneshot"] {
                assert_eq!(get("Restart"), ["on-failure"], "{unit}: Restart");
                assert_eq!(get("LimitNOFILE").len(), 1, "{unit}: LimitNOFILE");
            }
        }
        // The copy that systemd-analyze verifies runs the binaries built here.
        let local = text.replace("/usr/local/bin/", &format!("{}/", bin_dir.display()));
        std::fs::write(scratch.join(unit), local).unwrap();
    }

    for example in files.iter().filter(|f| f.ends_with(".env.example")) {
        let program = ["coordinator", "region-agent", "escrowctl"]
            .into_iter()
            .find(|p| example.starts_with(p))
            .unwrap_or_else(|| panic!("{example}: for which binary?"));
        let mut known = env_names(program);
        known.insert("RUST_LOG".into());
        let text = std::fs::read_to_string(systemd.join(example)).unwrap();
        // Commented-out examples count too: they are meant to be uncommented.
        for line in text.lines().map(|l| l.trim().trim_start_matches('#')) {
            let Some((name, value)) = line.split_once('=') else {
                continue;
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                continue;
            }
            assert!(
                known.contains(name),
                "{example}: {program} reads no {name} (it reads {known:?})"
            );
            assert_ne!(
                name, "REGION",
                "{example}: the unit's instance names the region"
            );
            if SECRET_VARS.contains(&name) && !value.starts_with("sqlite:") {
                assert!(
                    value.contains("CHANGE-ME"),
                    "{example}: {name} must be a placeholder"
                );
            }
        }
    }

    let paths: Vec<String> = units
        .iter()
        .map(|u| scratch.join(u).display().to_string())
        .collect();
    let args: Vec<&str> = ["verify"]
        .into_iter()
        .chain(paths.iter().map(String::as_str))
        .collect();
    if let Some(out) = run_tool("systemd-analyze", &args, &scratch) {
        // verify exits 0 on settings it ignores; any word on our units fails.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let about_ours: Vec<&str> = said
            .lines()
            .filter(|l| {
                units.iter().any(|u| l.contains(u.as_str()))
                    || l.contains(&scratch.display().to_string())
            })
            .collect();
        assert!(
            out.status.success() && about_ours.is_empty(),
            "systemd-analyze verify:\n{said}"
        );
    }
    std::fs::remove_dir_all(scratch).unwrap();
}

// ---------------------------------------------------------------------------
// The real binaries.

/// A fresh directory of this test process.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("deploy-artifacts-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A region agent `eu` on `database_url`, under `coordinator` (its URL and
/// the region's token) if given.
async fn start_agent(database_url: &str, coordinator: Option<(&str, &str)>) -> (Proc, Api) {
    let port = free_port();
    let mut cmd = service(binary("region-agent"), port, database_url);
    cmd.args(["--region", "eu"])
        .args(["--tenant-key", &format!("acme={ACME_KEY}")]);
    if let Some((url, token)) = coordinator {
        cmd.args(["--coordinator-url", url])
            .args(["--region-token", token])
            .args(["--sync-interval-ms", "50"]);
    }
    let proc = Proc::spawn(&mut cmd);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url).await;
    (proc, Api::new(&url))
}

async fn scrape(api: &Api) -> String {
    let r = api
        .client
        .get(format!("{}/metrics", api.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

/// A small sale of the agent's 3-unit SKU: three holds, a SOLD_OUT, a
/// confirm, a release, and a hold with the shortest TTL left to expire,
/// until the agent has counted the expired unit.
async fn sale(agent: &Api) {
    for i in 1..=3 {
        let key = format!("k-{i}");
        let held = agent
            .reserve_until_final(&key, &format!("u-{i}"), SKU)
            .await;
        assert_eq!(held.status, StatusCode::CREATED, "{key}: {}", held.body);
    }
    let sold_out = agent.reserve_until_final("k-4", "u-4", SKU).await;
    assert_eq!(sold_out.status, StatusCode::CONFLICT, "{}", sold_out.body);
    assert_eq!(sold_out.body["outcome"], "SOLD_OUT");
    let (status, body) = agent.action("k-1", "confirm").await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("SOLD")));
    let (status, body) = agent.action("k-2", "release").await;
    assert_eq!(
        (status, &body["status"]),
        (StatusCode::OK, &json!("RELEASED"))
    );
    eventually(
        "a hold with a 1 s TTL on the released unit",
        Duration::from_secs(30),
        async || {
            let r = agent
                .client
                .post(format!("{}/v1/reservations", agent.url))
                .bearer_auth(ACME_KEY)
                .json(&json!({"request_key": "k-short", "user_id": "u-short", "sku": SKU, "ttl_ms": 1_000}))
                .send()
                .await
                .unwrap();
            // 503 (units on their way back) is retried with the same key.
            r.status() == StatusCode::CREATED || r.status() == StatusCode::OK
        },
    )
    .await;
    eventually(
        "the short hold expires",
        Duration::from_secs(30),
        async || scrape(agent).await.contains("escrow_expired_units_total"),
    )
    .await;
}

/// Asserts that `exposition` (of `service`) exports every metric the
/// artifacts read whose name starts with `prefix`, but those `exempt`.
fn assert_exports(service: &str, exposition: &str, prefix: &str, exempt: &[&str]) {
    let exposition = Exposition::parse(exposition);
    let wanted: BTreeMap<String, BTreeSet<String>> = referenced()
        .into_iter()
        .filter(|(name, _)| name.starts_with(prefix) && !exempt.contains(&name.as_str()))
        .collect();
    assert!(!wanted.is_empty(), "the artifacts read no {prefix}* metric");
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(name, _)| !exposition.exports(name))
        .map(|(name, places)| format!("{name} (read by {places:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "{service} does not export:\n  {}\nIt exports: {:?}",
        missing.join("\n  "),
        exposition.families().collect::<Vec<_>>()
    );
    println!(
        "{service} exports all {} {prefix}* metrics the artifacts read",
        wanted.len()
    );
}

/// Goal: after a small sale, a standalone agent on SQLite exports every
/// agent metric the rules and the dashboard read (but the two only an
/// agent under a coordinator records), and its books balance.
#[tokio::test(flavor = "multi_thread")]
async fn a_standalone_agent_exports_what_the_artifacts_read() {
    let dir = scratch_dir("standalone");
    let db = format!("sqlite://{}", dir.join("agent-eu.db").display());
    let (agent, api) = start_agent(&db, None).await;
    let (status, body) = api.put_sku("acme", SKU, json!({"total": 3})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    sale(&api).await;
    assert_exports(
        "a standalone agent",
        &scrape(&api).await,
        "escrow_",
        &COORDINATED_ONLY,
    );
    api.assert_no_drift().await;
    drop(agent);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Goal: after a small sale through a real coordinator and one real agent
/// under it, each on a fresh database of the backend, the coordinator
/// exports every coordinator metric the rules and the dashboard read and
/// the agent every agent metric; the audit finds no drift. A 3-unit SKU is
/// below the tail-merge threshold, so it goes central at once: grants,
/// recalls, returns, a tail merge, notices and takes all happen.
async fn a_coordinator_and_its_agent_export_what_the_artifacts_read(db: TestDb) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let token = "token-eu";
    let coordinator = Proc::spawn(
        service(binary("coordinator"), port, db.url())
            .args(["--region-token", &format!("eu={token}")])
            .args(["--sync-interval-ms", "50"]),
    );
    wait_ready(&url).await;
    let admin = Api::new(&url);
    let agent_db = db
        .sibling(
            "agent-eu",
            &region_agent::store::postgres::MIGRATOR,
            &region_agent::store::sqlite::MIGRATOR,
        )
        .await;
    let (agent, api) = start_agent(agent_db.url(), Some((&url, token))).await;
    let (status, body) = admin
        .put_sku("acme", SKU, json!({"total": 3, "regions": {"eu": 1}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    eventually(
        "the agent learns the SKU",
        Duration::from_secs(30),
        async || {
            api.client
                .get(format!("{}/v1/skus/{SKU}", api.url))
                .bearer_auth(ACME_KEY)
                .send()
                .await
                .unwrap()
                .status()
                == StatusCode::OK
        },
    )
    .await;
    sale(&api).await;
    // Central mode keeps free units in the pool: the expired one goes back
    // as a return.
    eventually(
        "the expired unit returns to the pool",
        Duration::from_secs(30),
        async || {
            let sku = admin.admin_sku("acme", SKU).await;
            let eu = &sku["regions"]["eu"];
            (&sku["pool"], &eu["held"], &eu["sold"]) == (&json!(1), &json!(1), &json!(1))
        },
    )
    .await;
    // The audit is what sets coordinator_drift_units (the audit timer's job).
    let (status, audit) = admin.admin_get("/v1/admin/audit").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(audit["drift_total"], 0, "{audit:#}");
    assert_exports(
        "the coordinator",
        &scrape(&admin).await,
        "coordinator_",
        &[],
    );
    assert_exports(
        "an agent under a coordinator",
        &scrape(&api).await,
        "escrow_",
        &[],
    );
    drop(agent);
    drop(coordinator);
}

on_both_backends!(
    postgres: coordinator::store::POSTGRES_MIGRATOR,
    sqlite: coordinator::store::SQLITE_MIGRATOR;
    a_coordinator_and_its_agent_export_what_the_artifacts_read,
);
