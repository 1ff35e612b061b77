//! The admin console at `/console`, driven end to end in a real headless
//! Chromium (Debian's `chromium` and `chromium-driver`, over WebDriver with
//! fantoccini) against the real coordinator and two real region agents:
//! an admin signs in, creates a SKU, watches a small sale sell out, is
//! refused a change with the API's reason on screen, adds stock, pauses
//! and resumes, and reads drift 0. A screenshot of the page at a laptop's
//! 1366x768 is saved, and its path printed, for a person to look at.
//!
//! Skipped, with a message, where Chromium or its WebDriver is not
//! installed; a failure instead under `ESCROW_REQUIRE_TOOLS=1` (`.ci/run`
//! sets it and installs both).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use fantoccini::elements::Element;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use harness::cluster::AgentPlan;
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::StatusCode;
use serde_json::json;
use test_support::poll::within;

/// Units on sale at first: a sale small enough to sell out in a moment.
const TOTAL: u64 = 20;
/// Units added once it has sold out.
const ADDED: u64 = 2;
/// The regions, with a weight each.
const REGIONS: [&str; 2] = ["eu", "us"];
/// The agents' and the coordinator's sync interval.
const SYNC_INTERVAL_MS: u64 = 100;
/// The laptop screen the page must read well on.
const WINDOW: (u32, u32) = (1366, 768);
/// Window widths at which no panel may overlap another or spill out of
/// itself: a laptop's and a small one's.
const WIDTHS: [u32; 2] = [1280, 1024];
/// Longest the page may take to show what the services know.
const SHOWN_WITHIN: Duration = Duration::from_secs(15);

#[test]
fn an_admin_runs_a_sale_from_the_console() {
    let (Some(chromium), Some(driver)) = (on_path("chromium"), on_path("chromedriver")) else {
        test_support::tools::skip_without(
            "`chromium` and `chromedriver` on PATH (Debian: apt-get install chromium chromium-driver)",
            "tests/console.rs",
        );
        return;
    };
    test_support::backend::run_sqlite(&coordinator::store::SQLITE_MIGRATOR, |db| {
        an_admin_runs_a_sale(db, chromium, driver)
    });
}

/// Goal: everything an admin does in the console reaches the services, and
/// everything the services do shows in the console within a moment: the
/// live view counts a sale to sold = total, a refused change shows the
/// API's status, outcome and reason, pause and resume stop and restart
/// new holds at the agents, and drift reads 0 as the audit does.
async fn an_admin_runs_a_sale(db: TestDb, chromium: PathBuf, driver: PathBuf) {
    let cluster = Cluster::start(&db).await;
    let browser = Browser::start(&chromium, &driver).await;
    let page = &browser.page;

    // Signing in is typing the token and pressing Enter.
    page.goto(&format!("{}/console", cluster.admin.url))
        .await
        .unwrap();
    let token = page.find(Locator::Id("token")).await.unwrap();
    token.send_keys(ADMIN).await.unwrap();
    token.send_keys(&Key::Enter).await.unwrap();
    shows(page, "#sku-list-empty", "No SKU yet").await;
    assert_every_control_is_labelled(page).await;
    assert_panels_keep_apart(page, "no SKU open").await;

    // A region without a token at the coordinator is refused, with its reason.
    fill(page, "#create-tenant", "acme").await;
    fill(page, "#create-sku", "drop").await;
    fill(page, "#create-total", &TOTAL.to_string()).await;
    fill(page, "#create-weights", "eu=1, mars=1").await;
    page.find(Locator::Css("#create-policy"))
        .await
        .unwrap()
        .select_by_value("tail-merge")
        .await
        .unwrap();
    click(page, "#create-form button[type=submit]").await;
    shows(
        page,
        "#create-outcome",
        "Refused: 400 BAD_REQUEST: region mars has no --region-token here",
    )
    .await;
    let (status, _) = cluster.admin.admin_get("/v1/admin/skus/acme/drop").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a refused create wrote nothing"
    );

    fill(page, "#create-weights", "eu=1, us=1").await;
    click(page, "#create-form button[type=submit]").await;
    shows(page, "#create-outcome", "Created acme/drop: 20 units").await;
    shows(page, "#view-title", "acme/drop").await;
    shows(page, "#sku-rows", "acme/drop").await;
    for region in REGIONS {
        shows(page, &format!("[data-region={region}] h4"), region).await;
    }

    // A sale: buyers at both agents until nothing is left. While it runs
    // the SKU's sale rate is its regions' summed.
    let (sold, ()) = tokio::join!(cluster.sell_out("first"), sku_rate_is_the_regions_sum(page));
    assert_eq!(sold, TOTAL);
    // A second SKU with a long name and a large total widens the list.
    let (status, body) = cluster
        .admin
        .put_sku(
            "acme",
            "limited-edition-sneaker-2026",
            json!({"total": 1_000_000, "regions": {"eu": 1, "us": 1}}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    shows(page, "#sku-rows", "limited-edition-sneaker-2026").await;
    assert_panels_keep_apart(page, "a SKU open, two in the list").await;
    reads(page, "#sku-sold", "20").await;
    reads(page, "#sku-total", "20").await;
    reads(page, "#sku-user-limit", "1, in each region").await;
    reads(page, "#sku-available", "0").await;
    shows(page, "#sku-sold-out", "Sold out").await;
    assert_eq!(bars_sum(page, "sold").await, TOTAL);

    // Lowering the total below what is sold is refused, and nothing changes.
    fill(page, "#change-total", "10").await;
    click(page, "#change-form button[type=submit]").await;
    shows(
        page,
        "#action-outcome",
        "Refused: 409 CONFLICT: total may only be lowered by what is in the pool (0 units)",
    )
    .await;
    assert_eq!(
        cluster.admin.admin_sku("acme", "drop").await["total"],
        TOTAL
    );

    fill(page, "#stock-qty", &ADDED.to_string()).await;
    click(page, "#stock-form button[type=submit]").await;
    shows(
        page,
        "#action-outcome",
        "Added 2 units to acme/drop: the total is 22",
    )
    .await;
    reads(page, "#sku-total", "22").await;
    gone(page, "#sku-sold-out").await;

    // Pause by keyboard: the agents stop new holds.
    let toggle = page.find(Locator::Id("pause-toggle")).await.unwrap();
    assert_eq!(toggle.text().await.unwrap(), "Pause sales");
    toggle.send_keys(&Key::Enter).await.unwrap();
    reads(page, "#sku-state", "Paused").await;
    reads(page, "#pause-toggle", "Resume sales").await;
    assert_eq!(
        cluster.admin.admin_sku("acme", "drop").await["paused"],
        true
    );
    cluster.eventually_paused().await;

    toggle.send_keys(&Key::Enter).await.unwrap();
    reads(page, "#sku-state", "Selling").await;
    reads(page, "#pause-toggle", "Pause sales").await;
    let sold = cluster.sell_out("second").await;
    assert_eq!(sold, ADDED);
    reads(page, "#sku-sold", "22").await;
    shows(page, "#sku-sold-out", "Sold out").await;

    settled_audit(&cluster.admin, SHOWN_WITHIN).await;
    reads(page, "#sku-drift", "0").await;
    reads(page, "#sku-ledger-drift", "0").await;
    reads(page, "#sku-in-transit", "0").await;
    for region in REGIONS {
        let facts = format!("[data-region={region}] .facts");
        shown(page, &facts, "ends with drift 0", |t| {
            t.ends_with(" drift 0")
        })
        .await;
    }
    assert_eq!(bars_sum(page, "sold").await, TOTAL + ADDED);

    // The list's line: total, then sold.
    reads(page, "#sku-rows td:nth-of-type(2)", "22").await;
    page.execute("window.scrollTo(0, 0);", vec![])
        .await
        .unwrap();
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&screenshot, page.screenshot().await.unwrap()).unwrap();
    say(&format!(
        "tests/console.rs: screenshot of the console at {}x{}: {}",
        WINDOW.0,
        WINDOW.1,
        screenshot.display()
    ));
    browser.stop().await;
}

/// A coordinator and an agent per region, as their real binaries.
struct Cluster {
    admin: Api,
    agents: Vec<Api>,
    _processes: harness::cluster::Cluster,
    _agent_dbs: Vec<TestDb>,
}

impl Cluster {
    async fn start(db: &TestDb) -> Self {
        let mut agent_dbs = Vec::new();
        for region in REGIONS {
            agent_dbs.push(agent_db(db, region).await);
        }
        let agents = REGIONS
            .iter()
            .zip(&agent_dbs)
            .map(|(region, agent_db)| AgentPlan::new(region, agent_db.url()))
            .collect();
        let plan = test_support::cluster::plan(db.url(), agents, SYNC_INTERVAL_MS);
        let processes = harness::cluster::Cluster::launch(plan).await.unwrap();
        let url = |addr| format!("http://{addr}");
        Self {
            admin: Api::new(&url(processes.coordinator_addr())),
            agents: processes
                .agent_addrs()
                .into_iter()
                .map(|addr| Api::new(&url(addr)))
                .collect(),
            _processes: processes,
            _agent_dbs: agent_dbs,
        }
    }

    /// Buyers, one unit each, at the agents in turn, each confirming its
    /// hold, until both agents answer SOLD_OUT; the units they bought.
    async fn sell_out(&self, round: &str) -> u64 {
        let mut sold = 0;
        let mut sold_out = [false; REGIONS.len()];
        let mut buyer = 0;
        while !sold_out.iter().all(|s| *s) {
            let at = buyer % REGIONS.len();
            let key = format!("{round}-{buyer}");
            buyer += 1;
            let answer = self.agents[at]
                .reserve_until_final(&key, &key, "drop")
                .await;
            match answer.status {
                StatusCode::CREATED => {
                    let (status, body) = self.agents[at].action(&key, "confirm").await;
                    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("SOLD")));
                    sold += 1;
                    sold_out = [false; REGIONS.len()];
                }
                StatusCode::CONFLICT if answer.body["outcome"] == "SOLD_OUT" => {
                    sold_out[at] = true;
                }
                other => panic!("buyer {key}: {other} {}", answer.body),
            }
            assert!(buyer < 1_000, "the sale did not sell out");
        }
        sold
    }

    /// Waits until every agent refuses a new hold as PAUSED; a hold taken
    /// before the pause reached its agent is released.
    async fn eventually_paused(&self) {
        for (at, agent) in self.agents.iter().enumerate() {
            let mut attempt = 0;
            let paused = within(SHOWN_WITHIN, async || {
                attempt += 1;
                let key = format!("paused-{at}-{attempt}");
                let (status, body) = agent.reserve(&key, &key, "drop").await;
                if status == StatusCode::CREATED {
                    agent.action(&key, "release").await;
                }
                status == StatusCode::SERVICE_UNAVAILABLE && body["outcome"] == "PAUSED"
            })
            .await;
            assert!(paused, "agent {} went on selling", REGIONS[at]);
        }
    }
}

/// Chromium under its WebDriver, and the page it shows.
struct Browser {
    page: Client,
    driver: Proc,
}

impl Drop for Browser {
    /// Chromium runs in chromedriver's process group, and outlives a
    /// killed chromedriver: a test that fails before [`Browser::stop`]
    /// must not leave a browser running.
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    }
}

impl Browser {
    async fn start(chromium: &Path, driver: &Path) -> Self {
        let port = free_port();
        let driver = Proc::spawn(
            Command::new(driver)
                .arg(format!("--port={port}"))
                .process_group(0),
        );
        let url = format!("http://127.0.0.1:{port}");
        let status = reqwest::Client::new();
        let ready = within(Duration::from_secs(20), async || {
            match status.get(format!("{url}/status")).send().await {
                Ok(answer) => answer
                    .json::<serde_json::Value>()
                    .await
                    .is_ok_and(|s| s["value"]["ready"] == true),
                Err(_) => false,
            }
        })
        .await;
        assert!(ready, "chromedriver did not start");
        let window = format!("--window-size={},{}", WINDOW.0, WINDOW.1);
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // Root in a container: no sandbox, no reliance on a large /dev/shm.
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--hide-scrollbars", window],
            },
        });
        let page = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities.as_object().unwrap().clone())
            .connect(&url)
            .await
            .unwrap();
        Self { page, driver }
    }

    /// Ends the session: Chromium exits.
    async fn stop(self) {
        self.page.clone().close().await.unwrap();
    }
}

/// Waits until the element `css` shows a text containing `expected`.
async fn shows(page: &Client, css: &str, expected: &str) {
    shown(page, css, &format!("contains {expected:?}"), |t| {
        t.contains(expected)
    })
    .await;
}

/// Waits until the element `css` shows exactly `expected`.
async fn reads(page: &Client, css: &str, expected: &str) {
    shown(page, css, &format!("is {expected:?}"), |t| t == expected).await;
}

/// Waits until the text the element `css` shows passes `check`, which
/// `what` describes; fails the test with what it shows instead.
async fn shown(page: &Client, css: &str, what: &str, check: impl Fn(&str) -> bool) {
    let mut last = String::new();
    let passed = within(SHOWN_WITHIN, async || {
        last = text_of(page, css)
            .await
            .unwrap_or_else(|| "(absent)".into());
        check(&last)
    })
    .await;
    if !passed {
        failed(page, &format!("{css} shows {last:?}; expected: {what}")).await;
    }
}

/// Waits until the element `css` is hidden or absent.
async fn gone(page: &Client, css: &str) {
    let hidden = within(SHOWN_WITHIN, async || {
        text_of(page, css).await.is_none_or(|t| t.is_empty())
    })
    .await;
    if !hidden {
        failed(page, &format!("{css} still shows")).await;
    }
}

/// Fails the test with `why`, leaving a screenshot of the page to look at.
async fn failed(page: &Client, why: &str) -> ! {
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-failed.png");
    if let Ok(png) = page.screenshot().await {
        let _ = std::fs::write(&screenshot, png);
    }
    panic!("{why} (the page: {})", screenshot.display());
}

/// The text the element `css` shows, if it exists.
async fn text_of(page: &Client, css: &str) -> Option<String> {
    let element = page.find(Locator::Css(css)).await.ok()?;
    element.text().await.ok()
}

async fn find(page: &Client, css: &str) -> Element {
    page.find(Locator::Css(css)).await.unwrap()
}

/// Replaces the value of the input `css` with `value`, as typed.
async fn fill(page: &Client, css: &str, value: &str) {
    let input = find(page, css).await;
    input.clear().await.unwrap();
    input.send_keys(value).await.unwrap();
}

async fn click(page: &Client, css: &str) {
    find(page, css).await.click().await.unwrap();
}

/// The values of every region's `kind` bar (available, held or sold),
/// added up in the page in one step: the view redraws its regions on
/// every refresh, so elements found one call earlier may be gone.
async fn bars_sum(page: &Client, kind: &str) -> u64 {
    let css = format!("[data-region] .{kind} .bar-value");
    let sum = page
        .execute(
            "return [...document.querySelectorAll(arguments[0])]
               .reduce((sum, bar) => sum + Number(bar.textContent), 0);",
            vec![json!(css)],
        )
        .await
        .unwrap();
    sum.as_u64()
        .unwrap_or_else(|| panic!("the {kind} bars' sum: {sum}"))
}

/// Fails unless, at each of [`WIDTHS`], no two panels overlap and no
/// panel's content is wider than the panel (where it would run under its
/// neighbour); `when` names the page's state. Restores [`WINDOW`].
async fn assert_panels_keep_apart(page: &Client, when: &str) {
    for width in WIDTHS {
        page.set_window_size(width, WINDOW.1).await.unwrap();
        let clashes = page
            .execute(
                "const panels = [...document.querySelectorAll('.panel')]
                   .filter(p => p.offsetParent !== null);
                 const name = p => p.getAttribute('aria-labelledby') || p.id;
                 const clashes = [];
                 for (const p of panels) {
                   if (p.scrollWidth > p.clientWidth + 1) {
                     clashes.push(`${name(p)}: content ${p.scrollWidth} px wide in ${p.clientWidth} px`);
                   }
                 }
                 for (let i = 0; i < panels.length; i++) {
                   for (let j = i + 1; j < panels.length; j++) {
                     const a = panels[i].getBoundingClientRect();
                     const b = panels[j].getBoundingClientRect();
                     const x = Math.min(a.right, b.right) - Math.max(a.left, b.left);
                     const y = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
                     if (x > 0.5 && y > 0.5) {
                       clashes.push(`${name(panels[i])} and ${name(panels[j])} overlap by ${x.toFixed(0)} x ${y.toFixed(0)} px`);
                     }
                   }
                 }
                 return clashes;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            clashes,
            json!([]),
            "at {width} px wide, {when}: panels overlap or spill"
        );
    }
    page.set_window_size(WINDOW.0, WINDOW.1).await.unwrap();
}

/// Waits until the live view shows a sale rate above 0, then fails unless
/// the SKU's rate is its regions' summed (each shown to 0.01).
async fn sku_rate_is_the_regions_sum(page: &Client) {
    let read = r"const sku = parseFloat(document.getElementById('sku-rate').textContent);
                const regions = [...document.querySelectorAll('[data-region] .facts')]
                  .map(f => (f.textContent.match(/sales ([0-9.]+) units\/s/) || [])[1])
                  .filter(r => r !== undefined)
                  .map(parseFloat);
                return [sku, regions];";
    let deadline = std::time::Instant::now() + SHOWN_WITHIN;
    loop {
        let shown = page.execute(read, vec![]).await.unwrap();
        let sku = shown[0].as_f64();
        let regions: Vec<f64> = shown[1]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        let sum: f64 = regions.iter().sum();
        if sum > 0.0 {
            let sku = sku.unwrap_or(f64::NAN);
            assert!(
                (sku - sum).abs() <= 0.011 * regions.len() as f64,
                "the SKU's sale rate {sku} is not its regions' {regions:?} summed"
            );
            return;
        }
        if std::time::Instant::now() > deadline {
            failed(page, "no region showed a sale rate above 0 during the sale").await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every input and select has a label, and every button says what it does.
async fn assert_every_control_is_labelled(page: &Client) {
    let unlabelled = page
        .execute(
            "return [...document.querySelectorAll('input, select, textarea')]
                 .filter((c) => c.labels.length === 0).map((c) => c.id)
               .concat([...document.querySelectorAll('button')]
                 .filter((b) => b.textContent.trim() === '')
                 .map((b) => b.id || b.outerHTML));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(unlabelled, json!([]), "controls without a label");
}

/// The path of the program `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Writes `line` to the real stderr, past the test harness's capture.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
