//! Samples of the world for the reports' time series.

use super::*;

impl World {
    pub(super) fn sample(&mut self) {
        let c = self.census;
        let t_ms = self.ms_after_start(self.now_us);
        let s = &mut self.rec.series;
        s.t_ms.push(t_ms);
        for (r, a) in self.agents.iter().enumerate() {
            s.available[r].push(a.db.book.ledger.available);
        }
        s.pool.push(c.pool);
        s.in_transit.push(c.in_transit);
        s.taken.push(c.held + c.sold);
        s.false_sold_outs.push(self.rec.false_sold_outs);
        self.next_sample_ms *= SAMPLE_FACTOR;
        let at = self.sale_start_us + (self.next_sample_ms * 1_000.0) as u64;
        self.queue.push(at.max(self.now_us + 1), Event::Sample);
    }
}
