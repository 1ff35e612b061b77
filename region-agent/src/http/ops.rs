//! What the agent tells the operations endpoints both services serve
//! (`service_kit::ops`): it is not ready once fenced, and its clock's step
//! is read when the metrics are scraped.

use service_kit::ops::Operated;

use crate::clock::SystemClock;
use crate::state::AppState;

impl Operated for AppState {
    async fn unready(&self) -> Option<&'static str> {
        if self.fence().is_fenced() {
            return Some("fenced");
        }
        service_kit::ops::database_unready(self.store().ready().await)
    }

    fn scrape(&self) -> String {
        // Read when scraped: the gauge is as fresh as the scrape.
        metrics::gauge!("escrow_clock_step_ms").set(SystemClock.step_ms() as f64);
        self.metrics().render()
    }
}
