//! `escrowctl`: admin CLI (being written).
fn main() {}
