//! The event queue: a min-heap keyed by (time, sequence number).
//!
//! Events at the same microsecond leave in the order they were scheduled,
//! which is what makes a run a pure function of its seed: no tie is ever
//! broken by memory addresses or hash order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Most events ever pending at once; a runaway schedule crashes loudly.
pub const QUEUE_LEN_MAX: usize = 50_000_000;

struct Entry<E> {
    at_us: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}

/// Pending events in time order.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `at_us`.
    pub fn push(&mut self, at_us: u64, event: E) {
        assert!(self.heap.len() < QUEUE_LEN_MAX, "event queue overflow");
        self.heap.push(Entry {
            at_us,
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
    }

    /// The earliest event, removed.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.heap.pop().map(|e| (e.at_us, e.event))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.at_us)
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: earlier first, and ties leave in scheduling order.
    #[test]
    fn time_then_sequence() {
        let mut q = EventQueue::default();
        q.push(5, "c");
        q.push(1, "a");
        q.push(5, "d");
        q.push(1, "b");
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!["a", "b", "c", "d"]);
    }
}
