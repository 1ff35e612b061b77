//! What request handlers may read of a SKU without asking its owner.
//!
//! The owner task publishes its state here after every batch; handlers read
//! it lock-free to answer sold-out and paused at once and to show the SKU.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::RwLock;

use escrow_core::owner::{GateView, SkuOwner};
use escrow_core::{Mode, RegionName, Sku, SkuSettings, Tenant, TtlMs, UserLimitScope};

/// A SKU's published state.
#[derive(Debug)]
pub struct SkuView {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    available: AtomicU64,
    held: AtomicU64,
    sold: AtomicU64,
    quota: AtomicU64,
    paused: AtomicBool,
    halted: AtomicBool,
    max_per_user: AtomicU32,
    hold_ttl_ms: AtomicU64,
    global_limit: AtomicBool,
    limit_regions: RwLock<Vec<RegionName>>,
    central: AtomicBool,
    coordinated: AtomicBool,
    sold_out_everywhere: AtomicBool,
    rate_bits: AtomicU64,
    set_aside: AtomicU64,
}

/// A point-in-time copy of a [`SkuView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SkuSnapshot {
    /// Units that may be held now.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// The region's quota: received - returned (standalone: the SKU's total).
    pub quota: u64,
    /// Paused by an admin.
    pub paused: bool,
    /// Stopped by the agent itself: drift, fencing or a failed commit.
    pub halted: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
}

impl SkuView {
    /// A view that refuses everything until its owner first publishes.
    pub fn new(tenant: Tenant, sku: Sku) -> Self {
        Self {
            tenant,
            sku,
            available: AtomicU64::new(0),
            held: AtomicU64::new(0),
            sold: AtomicU64::new(0),
            quota: AtomicU64::new(0),
            paused: AtomicBool::new(true),
            halted: AtomicBool::new(true),
            max_per_user: AtomicU32::new(1),
            hold_ttl_ms: AtomicU64::new(SkuSettings::default().hold_ttl.get()),
            global_limit: AtomicBool::new(false),
            limit_regions: RwLock::new(Vec::new()),
            central: AtomicBool::new(false),
            coordinated: AtomicBool::new(false),
            sold_out_everywhere: AtomicBool::new(false),
            rate_bits: AtomicU64::new(0),
            set_aside: AtomicU64::new(0),
        }
    }

    /// Copies the owner's state.
    pub fn publish(&self, owner: &SkuOwner, coordinated: bool) {
        let ledger = owner.ledger();
        let settings = owner.settings();
        self.available.store(ledger.available, Ordering::Release);
        self.held.store(ledger.held, Ordering::Release);
        self.sold.store(ledger.sold, Ordering::Release);
        self.quota.store(ledger.quota(), Ordering::Release);
        self.max_per_user
            .store(settings.max_per_user, Ordering::Release);
        self.hold_ttl_ms
            .store(settings.hold_ttl.get(), Ordering::Release);
        self.global_limit.store(
            settings.user_limit_scope == UserLimitScope::Global,
            Ordering::Release,
        );
        self.paused.store(owner.is_paused(), Ordering::Release);
        self.halted.store(owner.is_halted(), Ordering::Release);
        self.central
            .store(owner.mode() == Mode::Central, Ordering::Release);
        self.coordinated.store(coordinated, Ordering::Release);
        self.sold_out_everywhere
            .store(owner.is_sold_out_everywhere(), Ordering::Release);
        self.publish_rate(owner);
        self.set_aside
            .store(owner.units_set_aside(), Ordering::Release);
    }

    /// Copies the owner's demand alone, between two [`Self::publish`]es:
    /// a sync the owner asks for in the middle of a batch reads it here,
    /// and must carry the figure that asked for it.
    pub fn publish_rate(&self, owner: &SkuOwner) {
        self.rate_bits
            .store(owner.sale_rate_per_s().to_bits(), Ordering::Release);
    }

    /// Marks the SKU halted (its owner stopped).
    pub fn halt(&self) {
        self.halted.store(true, Ordering::Release);
    }

    /// What the gate answers from.
    pub fn gate_view(&self, link_down: bool) -> GateView {
        GateView {
            available: self.available(),
            paused: self.paused.load(Ordering::Acquire),
            halted: self.halted.load(Ordering::Acquire),
            central: self.central.load(Ordering::Acquire),
            coordinated: self.coordinated.load(Ordering::Acquire),
            link_down,
            sold_out_everywhere: self.is_sold_out_everywhere(),
        }
    }

    /// Whether the SKU sells in central mode (tail merged).
    pub fn is_central(&self) -> bool {
        self.central.load(Ordering::Acquire)
    }

    /// Whether the coordinator said no unit is free anywhere.
    pub fn is_sold_out_everywhere(&self) -> bool {
        self.sold_out_everywhere.load(Ordering::Acquire)
    }

    /// Units held per second, recently.
    pub fn sale_rate_per_s(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Acquire))
    }

    /// Units set aside for carts not yet written, as of the last batch
    /// or cart end.
    pub fn units_set_aside(&self) -> u64 {
        self.set_aside.load(Ordering::Acquire)
    }

    /// Units available now, as of the last commit.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Acquire)
    }

    /// Whether the SKU refuses to sell (admin pause, drift, fencing, failed commit).
    pub fn is_stopped(&self) -> bool {
        self.paused.load(Ordering::Acquire) || self.halted.load(Ordering::Acquire)
    }

    /// The SKU's current settings.
    pub fn settings(&self) -> SkuSettings {
        let hold_ttl = TtlMs::parse(self.hold_ttl_ms.load(Ordering::Acquire) as i64)
            .expect("only a valid TtlMs is ever published");
        let user_limit_scope = if self.global_limit.load(Ordering::Acquire) {
            UserLimitScope::Global
        } else {
            UserLimitScope::Region
        };
        SkuSettings {
            max_per_user: self.max_per_user.load(Ordering::Acquire),
            hold_ttl,
            user_limit_scope,
        }
    }

    /// Records the SKU's regions as the coordinator last named them for
    /// its global per-user limit (empty under a `region` scope).
    pub fn set_limit_regions(&self, regions: Vec<RegionName>) {
        *self
            .limit_regions
            .write()
            .unwrap_or_else(|e| e.into_inner()) = regions;
    }

    /// The SKU's regions a user's home is chosen among; empty until the
    /// coordinator has named them.
    pub fn limit_regions(&self) -> Vec<RegionName> {
        self.limit_regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A copy of every field.
    pub fn snapshot(&self) -> SkuSnapshot {
        SkuSnapshot {
            available: self.available(),
            held: self.held.load(Ordering::Acquire),
            sold: self.sold.load(Ordering::Acquire),
            quota: self.quota.load(Ordering::Acquire),
            paused: self.paused.load(Ordering::Acquire),
            halted: self.halted.load(Ordering::Acquire),
            max_per_user: self.max_per_user.load(Ordering::Acquire),
            hold_ttl_ms: self.hold_ttl_ms.load(Ordering::Acquire),
        }
    }
}
