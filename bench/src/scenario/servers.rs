//! The servers under test, each a child process on its own scratch
//! database or file: the region agent (on PostgreSQL or SQLite), the naive
//! baseline and the HTTP ceiling.

use std::net::SocketAddr;

use harness::database::ScratchDb;
use harness::process::{free_addr, ServerProcess};
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};

use crate::bench_server;
use crate::database::ScratchFile;

use super::{AgentBackend, AgentFlags, Settings};

/// A server under test and its scratch database or file.
pub(super) struct Target {
    pub(super) process: ServerProcess,
    pub(super) db: Option<ScratchDb>,
    pub(super) file: Option<ScratchFile>,
}

impl Target {
    pub(super) fn addr(&self) -> SocketAddr {
        self.process.addr
    }

    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.process.stop().await?;
        if let Some(db) = self.db {
            db.drop().await?;
        }
        if let Some(file) = self.file {
            file.remove()?;
        }
        Ok(())
    }
}

pub(super) fn db_name(kind: &str, tag: &str) -> String {
    format!("bench_{kind}_{}_{tag}", std::process::id())
}

pub(super) async fn start_agent(
    settings: &Settings,
    flags: AgentFlags,
    backend: AgentBackend,
    tag: &str,
) -> anyhow::Result<Target> {
    start_agent_with(settings, flags, backend, tag, &[]).await
}

/// [`start_agent`] with `extra` flags (a coordinator to sell through).
pub(super) async fn start_agent_with(
    settings: &Settings,
    flags: AgentFlags,
    backend: AgentBackend,
    tag: &str,
    extra: &[String],
) -> anyhow::Result<Target> {
    let (db, file, url) = match backend {
        AgentBackend::Postgres => {
            let db = ScratchDb::create(&settings.database_url, &db_name("agent", tag)).await?;
            let url = db.url.clone();
            (Some(db), None, url)
        }
        AgentBackend::Sqlite => {
            let file = ScratchFile::create(&db_name("agent", tag))?;
            let url = file.url.clone();
            (None, Some(file), url)
        }
        AgentBackend::Url(url) => (None, None, url),
    };
    let addr = free_addr()?;
    let mut args: Vec<String> = [
        "--region",
        "eu",
        "--listen",
        &addr.to_string(),
        "--database-url",
        &url,
        "--admin-token",
        ADMIN_TOKEN,
        "--tenant-key",
        &format!("{TENANT}={TENANT_KEY}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(flags.args());
    args.extend_from_slice(extra);
    let name = format!("region-agent ({tag})");
    let process = ServerProcess::start(&name, &settings.binaries.agent, &args, addr).await?;
    Ok(Target { process, db, file })
}

pub(super) async fn start_naive(settings: &Settings, tag: &str) -> anyhow::Result<Target> {
    let db = ScratchDb::create(&settings.database_url, &db_name("naive", tag)).await?;
    let addr = free_addr()?;
    let args = vec![
        "--mode".into(),
        "naive".into(),
        "--listen".into(),
        addr.to_string(),
        "--database-url".into(),
        db.url.clone(),
        "--db-pool-size".into(),
        settings.naive_pool_size.to_string(),
    ];
    let process =
        ServerProcess::start("naive", &bench_server(&settings.binaries), &args, addr).await?;
    Ok(Target {
        process,
        db: Some(db),
        file: None,
    })
}

pub(super) async fn start_ceiling(settings: &Settings) -> anyhow::Result<Target> {
    let addr = free_addr()?;
    let args = vec![
        "--mode".into(),
        "ceiling".into(),
        "--listen".into(),
        addr.to_string(),
    ];
    let process =
        ServerProcess::start("ceiling", &bench_server(&settings.binaries), &args, addr).await?;
    Ok(Target {
        process,
        db: None,
        file: None,
    })
}
