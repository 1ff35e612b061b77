//! Carts' group commit: the carts ready at once share one transaction, as
//! the batches of many SKUs do in [`crate::committer`].
//!
//! One worker takes every cart waiting (up to [`CARTS_PER_COMMIT_MAX`])
//! and commits them together ([`Store::commit_carts`]): under a rush of
//! carts over the same SKUs, each counter row moves once per group instead
//! of once per cart, and carts never wait on each other's row locks. A
//! cart whose item the database refused is answered alone and the others
//! are committed again without it. A group that failed as a whole with a
//! definite error (nothing written: a deadlock with an owner's commit, a
//! connection lost before the commit was asked) is tried again
//! [`RETRIES`] times before its carts are told; one whose outcome is
//! unknown is told at once, and each cart settles it from the database.

use std::sync::Arc;

use escrow_core::cart::{CartCommit, CartWritten};
use tokio::sync::{mpsc, oneshot};

use crate::committer::answered;
use crate::fence::Fence;
use crate::store::{BatchError, Store, StoreError};

/// Most carts one transaction carries.
pub const CARTS_PER_COMMIT_MAX: usize = 64;

/// Times a group that failed as a whole, writing nothing, is tried again.
const RETRIES: usize = 2;

/// A cart and where its result goes.
type Job = (CartCommit, oneshot::Sender<Result<CartWritten, StoreError>>);

/// The way into the carts' committer; cheap to clone.
#[derive(Debug, Clone)]
pub struct CartCommitter {
    jobs: mpsc::Sender<Job>,
}

impl CartCommitter {
    /// Starts the worker over `store`, writing under `fence`'s epoch. It
    /// stops once every [`CartCommitter`] is dropped.
    pub fn spawn(store: Arc<dyn Store>, fence: Arc<Fence>) -> Self {
        let (jobs, queue) = mpsc::channel(CARTS_PER_COMMIT_MAX * 4);
        tokio::spawn(work(store, fence, queue));
        Self { jobs }
    }

    /// Commits `cart` durably with whatever other carts are ready.
    pub async fn commit(&self, cart: CartCommit) -> Result<CartWritten, StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send((cart, reply)).await.is_err() {
            return Err(StoreError::Database(
                "the carts' committer has stopped".into(),
            ));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Database("the carts' committer stopped".into())))
    }
}

/// The worker: gather what is waiting, commit it in one transaction, answer.
async fn work(store: Arc<dyn Store>, fence: Arc<Fence>, mut queue: mpsc::Receiver<Job>) {
    while let Some(first) = queue.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < CARTS_PER_COMMIT_MAX {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        commit(store.as_ref(), &fence, jobs).await;
    }
}

/// Commits `jobs` in one transaction, leaving out (and answering) each
/// cart the database refused, until the rest commit or fail as a whole.
async fn commit(store: &dyn Store, fence: &Fence, mut jobs: Vec<Job>) {
    let mut retries = 0;
    while !jobs.is_empty() {
        let carts: Vec<&CartCommit> = jobs.iter().map(|(cart, _)| cart).collect();
        metrics::histogram!("escrow_cart_commit_carts").record(carts.len() as f64);
        let result = answered(store, store.commit_carts(fence.epoch(), &carts))
            .await
            .unwrap_or_else(|| {
                Err(BatchError::whole(StoreError::OutcomeUnknown(
                    "no answer from the database, or its primary moved to another host".into(),
                )))
            });
        match result {
            Ok(written) => {
                for ((_, reply), written) in jobs.into_iter().zip(written) {
                    let _ = reply.send(Ok(written));
                }
                return;
            }
            Err(BatchError {
                batch: Some(index),
                error,
            }) => {
                let (_, reply) = jobs.remove(index);
                let _ = reply.send(Err(error));
            }
            Err(BatchError {
                error: StoreError::Database(_) | StoreError::Conflict(_),
                ..
            }) if retries < RETRIES => retries += 1,
            Err(BatchError { error, .. }) => {
                for (_, reply) in jobs {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
        }
    }
}
