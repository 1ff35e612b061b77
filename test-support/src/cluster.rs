//! A coordinator and its region agents as real processes, as the tests
//! start them: the `harness` crate's [`Plan`] with the tests' credentials
//! (admin token [`ADMIN`], tenant `acme` with [`ACME_KEY`]), the binaries
//! built beside the test (`cargo build --workspace --bins`), every flag
//! but the sync interval at the services' default, logs on stderr.

use harness::cluster::{AgentPlan, ClusterFlags, Credentials, Logs, Plan};
use harness::process::{Binaries, Env};

use crate::api::{ACME_KEY, ADMIN};

/// The tests' credentials.
pub fn credentials() -> Credentials {
    Credentials {
        admin_token: ADMIN.to_owned(),
        tenant: "acme".to_owned(),
        tenant_key: ACME_KEY.to_owned(),
    }
}

/// A coordinator on `coordinator_database_url` and `agents`, every process
/// syncing every `sync_interval_ms`.
pub fn plan(coordinator_database_url: &str, agents: Vec<AgentPlan>, sync_interval_ms: u64) -> Plan {
    let binaries = Binaries::locate(None).unwrap();
    if let Err(missing) = binaries.check_cluster() {
        panic!("{missing:#}: run `cargo build --workspace --bins` first");
    }
    Plan {
        binaries,
        credentials: credentials(),
        flags: ClusterFlags::syncing_every(sync_interval_ms),
        policy: None,
        logs: Logs::Stderr,
        coordinator_database_url: coordinator_database_url.to_owned(),
        coordinator_env: Env::new(),
        agents,
    }
}
