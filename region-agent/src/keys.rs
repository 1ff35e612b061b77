//! Request keys that have a committed reservation, per tenant, each with
//! the SKU it reserved.
//!
//! A retry of a key that holds a reservation must get REPLAY even when the
//! SKU is sold out, yet the sold-out answer must not touch the database.
//! This map lets the request path tell the two apart from memory: a known
//! key is looked up, an unknown one on a sold-out SKU is refused at once.
//! It also routes confirm, release and extend to the owner of the key's
//! SKU without reading the row first.
//!
//! Memory does not grow with history. Keys live in two generations, each
//! one idempotency window long: new keys go to the current one, and every
//! window the older generation leaves memory and the current one becomes
//! the older. So a key stays in memory for one to two windows. Every key
//! ever committed is also set in a Bloom filter of fixed size, which never
//! forgets: a key memory no longer holds but the filter may have seen
//! ([`KnownKeys::may_know`]) is looked up in the database, as a known key
//! is. The filter's false positives (about 1% up to its capacity, more
//! beyond it) cost a new buyer on a sold-out SKU one read; they never change
//! an answer.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use bloomfilter::Bloom;
use escrow_core::ids::ID_LEN_MAX;
use escrow_core::{RequestKey, Sku, Tenant};

/// False positive rate of the filter of every key, up to its capacity.
const FILTER_FP_RATE: f64 = 0.01;

/// Keys of one generation, by tenant.
type Generation = HashMap<Tenant, HashMap<RequestKey, Arc<Sku>>>;

/// Committed request keys by tenant, with their SKUs.
#[derive(Debug)]
pub struct KnownKeys {
    inner: RwLock<Inner>,
    window_ms: u64,
}

#[derive(Debug)]
struct Inner {
    current: Generation,
    older: Generation,
    skus: HashMap<Sku, Arc<Sku>>,
    seen: Bloom<[u8]>,
}

impl Inner {
    fn sku_of(&self, tenant: &Tenant, key: &RequestKey) -> Option<Arc<Sku>> {
        [&self.current, &self.older]
            .into_iter()
            .find_map(|generation| generation.get(tenant)?.get(key).cloned())
    }
}

impl KnownKeys {
    /// An empty map whose generations last `window_ms` each and whose
    /// filter holds `capacity` keys at its nominal rate.
    pub fn new(window_ms: u64, capacity: usize) -> Self {
        let seen = Bloom::new_for_fp_rate(capacity.max(1), FILTER_FP_RATE)
            .expect("a positive capacity and a rate in (0, 1)");
        Self {
            inner: RwLock::new(Inner {
                current: Generation::new(),
                older: Generation::new(),
                skus: HashMap::new(),
                seen,
            }),
            window_ms,
        }
    }

    /// Whether memory holds `key` for `tenant`.
    pub fn contains(&self, tenant: &Tenant, key: &RequestKey) -> bool {
        self.sku_of(tenant, key).is_some()
    }

    /// Whether `key` may have a committed reservation for `tenant`: memory
    /// holds it, or it left memory (or is a false positive of the filter).
    /// Only `false` is certain: such a key was never committed.
    pub fn may_know(&self, tenant: &Tenant, key: &RequestKey) -> bool {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.sku_of(tenant, key).is_some() || with_item(tenant, key, |item| inner.seen.check(item))
    }

    /// The SKU `key` reserved for `tenant`, if memory holds it.
    pub fn sku_of(&self, tenant: &Tenant, key: &RequestKey) -> Option<Arc<Sku>> {
        // A poisoned lock means a panic elsewhere while inserting; the map itself is still valid.
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.sku_of(tenant, key)
    }

    /// Records a newly committed key of `sku`.
    pub fn insert(&self, tenant: &Tenant, sku: &Sku, key: RequestKey) {
        self.extend(tenant, sku, [key]);
    }

    /// Records many committed keys of `sku` in the current generation.
    pub fn extend(&self, tenant: &Tenant, sku: &Sku, keys: impl IntoIterator<Item = RequestKey>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        let shared = inner
            .skus
            .entry(sku.clone())
            .or_insert_with(|| Arc::new(sku.clone()))
            .clone();
        let map = inner.current.entry(tenant.clone()).or_default();
        for key in keys {
            with_item(tenant, &key, |item| inner.seen.set(item));
            map.insert(key, shared.clone());
        }
    }

    /// Records a stored key of `sku` whose reservation was created at
    /// `created_ms`: in the filter, and in memory too if it was created
    /// within the window before `now_ms`.
    pub fn load(&self, tenant: &Tenant, sku: &Sku, key: RequestKey, created_ms: u64, now_ms: u64) {
        if created_ms >= now_ms.saturating_sub(self.window_ms) {
            return self.insert(tenant, sku, key);
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        with_item(tenant, &key, |item| inner.seen.set(item));
    }

    /// Forgets `key` of `tenant`: its reservation was pruned.
    pub fn remove(&self, tenant: &Tenant, key: &RequestKey) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        for generation in [&mut inner.current, &mut inner.older] {
            if let Some(keys) = generation.get_mut(tenant) {
                keys.remove(key);
            }
        }
    }

    /// Gives back the room forgotten keys left, after a prune.
    pub fn shrink(&self) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        for generation in [&mut inner.current, &mut inner.older] {
            for keys in generation.values_mut() {
                keys.shrink_to_fit();
            }
        }
    }

    /// Ends a window: the older generation leaves memory (its keys stay in
    /// the filter) and the current one becomes the older. Returns how many
    /// keys left.
    pub fn rotate(&self) -> usize {
        let leaving = {
            let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
            let current = std::mem::take(&mut inner.current);
            std::mem::replace(&mut inner.older, current)
        };
        // Dropped outside the lock: freeing millions of keys takes a while.
        leaving.values().map(HashMap::len).sum()
    }

    /// Keys memory holds, in both generations.
    pub fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        [&inner.current, &inner.older]
            .into_iter()
            .flat_map(|generation| generation.values())
            .map(HashMap::len)
            .sum()
    }

    /// Whether memory holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Calls `f` with what the filter hashes for a tenant's key: both names
/// and a separator neither can contain, built on the stack.
fn with_item<R>(tenant: &Tenant, key: &RequestKey, f: impl FnOnce(&[u8]) -> R) -> R {
    let (tenant, key) = (tenant.as_str().as_bytes(), key.as_str().as_bytes());
    let mut buf = [0u8; 2 * ID_LEN_MAX + 1];
    let end = tenant.len() + 1 + key.len();
    buf[..tenant.len()].copy_from_slice(tenant);
    buf[tenant.len()] = b'/';
    buf[tenant.len() + 1..end].copy_from_slice(key);
    f(&buf[..end])
}

/// Ends a window every window while the agent's keys exist.
pub async fn rotate_every(keys: Weak<KnownKeys>) {
    let Some(window_ms) = keys.upgrade().map(|k| k.window_ms) else {
        return;
    };
    let mut ticks = tokio::time::interval(Duration::from_millis(window_ms.max(1)));
    // The first tick is at once: the window starts now.
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        let left = keys.rotate();
        tracing::info!(
            left,
            kept = keys.len(),
            "request keys older than the idempotency window left memory"
        );
    }
}
