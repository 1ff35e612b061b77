//! Cross-SKU group commit: the batches of many SKU owners share one
//! transaction, so a hundred warm SKUs pay one durable flush together, as
//! the buyers of one hot SKU already do.
//!
//! Each owner still decides its own batches alone and has at most one in
//! flight; it hands the batch here and waits. [`COMMITTERS`] workers take
//! turns at one queue: a worker takes every batch waiting (up to
//! [`BATCHES_PER_COMMIT_MAX`]) and commits them in one transaction while
//! the next worker gathers what arrives meanwhile. A transaction is all
//! or nothing; when one batch's own writes fail, that batch alone is
//! answered with the error (its owner reloads) and the others are
//! committed again without it, so one SKU's failure costs the others a
//! retry, never their batch. A transaction that fails as a whole (lost
//! connection, lost lease) fails every batch it carried.
//!
//! A transaction gets [`DATABASE_ANSWER_TIMEOUT`] to answer, and no more
//! once the database's primary moves to another host. A primary whose
//! machine froze never answers and never closes its connections; past the
//! bound, or the move, its batches' outcome is unknown
//! ([`StoreError::OutcomeUnknown`]) and their owners settle them from the
//! database, wherever its primary is then. The commit on the server is not
//! cancelled (the connection is left behind): a commit waiting for its
//! standby ends by the server's own rules.

use std::sync::Arc;
use std::time::{Duration, Instant};

use escrow_core::batch::{Batch, BatchOutcome};
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::fence::Fence;
use crate::store::{BatchError, Store, StoreError};

/// Transactions in flight at once, each carrying the batches of many SKUs.
pub const COMMITTERS: usize = 4;

/// Most batches one transaction carries.
pub const BATCHES_PER_COMMIT_MAX: usize = 128;

/// Longest a transaction (or an owner's read) waits for the database's
/// answer: past the server's own `statement_timeout` (10 s), so a server
/// that answers ends its statements itself. A call ends sooner when the
/// database's primary moves ([`answered`]): what was in flight on the old
/// host is settled on the new one.
pub const DATABASE_ANSWER_TIMEOUT: Duration = Duration::from_secs(12);

/// A batch and where its result goes, with the batch handed back.
type Job = (
    Batch,
    oneshot::Sender<(Batch, Result<BatchOutcome, StoreError>)>,
);

/// The way into the committers; cheap to clone.
#[derive(Debug, Clone)]
pub struct Committer {
    jobs: mpsc::Sender<Job>,
}

impl Committer {
    /// Starts the workers over `store`, writing under `fence`'s epoch. They
    /// stop once every [`Committer`] is dropped.
    pub fn spawn(store: Arc<dyn Store>, fence: Arc<Fence>) -> Self {
        let (jobs, queue) = mpsc::channel(BATCHES_PER_COMMIT_MAX * COMMITTERS);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..COMMITTERS {
            tokio::spawn(work(store.clone(), fence.clone(), queue.clone()));
        }
        Self { jobs }
    }

    /// Commits `batch` durably with whatever other batches are ready, and
    /// hands it back with its outcome.
    pub async fn commit(&self, batch: Batch) -> (Batch, Result<BatchOutcome, StoreError>) {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError((batch, _))) = self.jobs.send((batch, reply)).await {
            return (batch, Err(stopped()));
        }
        answer.await.expect("a worker answers every batch it takes")
    }
}

fn stopped() -> StoreError {
    StoreError::Database("the committers have stopped".into())
}

/// One worker: gather what is waiting, commit it in one transaction, answer.
async fn work(store: Arc<dyn Store>, fence: Arc<Fence>, queue: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let jobs = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut jobs = vec![first];
            while jobs.len() < BATCHES_PER_COMMIT_MAX {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            jobs
        };
        commit(store.as_ref(), &fence, jobs).await;
    }
}

/// Commits `jobs` in one transaction, leaving out (and answering) each
/// batch that fails on its own until the rest commit or fail as a whole.
async fn commit(store: &dyn Store, fence: &Fence, mut jobs: Vec<Job>) {
    loop {
        let batches: Vec<&Batch> = jobs.iter().map(|(batch, _)| batch).collect();
        metrics::histogram!("escrow_commit_batches").record(batches.len() as f64);
        let started = Instant::now();
        let result = answered(store, store.commit_all(fence.epoch(), &batches))
            .await
            .unwrap_or_else(|| {
                Err(BatchError::whole(StoreError::OutcomeUnknown(format!(
                    "no answer from the database in {DATABASE_ANSWER_TIMEOUT:?}, \
                     or its primary moved to another host"
                ))))
            });
        metrics::histogram!("escrow_commit_seconds").record(started.elapsed().as_secs_f64());
        match result {
            Ok(outcomes) => {
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    answer(job, Ok(outcome));
                }
                return;
            }
            Err(BatchError {
                batch: Some(index),
                error,
            }) if jobs.len() > 1 => answer(jobs.remove(index), Err(error)),
            Err(BatchError { error, .. }) => {
                for job in jobs {
                    answer(job, Err(error.clone()));
                }
                return;
            }
        }
    }
}

/// `call`'s answer, or `None` if the database gives none within
/// [`DATABASE_ANSWER_TIMEOUT`] or its primary moves to another host first
/// (a call on the old one will not be answered).
pub async fn answered<T>(
    store: &dyn Store,
    call: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        answer = call => Some(answer),
        () = tokio::time::sleep(DATABASE_ANSWER_TIMEOUT) => None,
        () = store.primary_moved() => None,
    }
}

fn answer((batch, reply): Job, outcome: Result<BatchOutcome, StoreError>) {
    // An owner that went away has nobody left to tell.
    let _ = reply.send((batch, outcome));
}
