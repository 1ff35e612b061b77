//! Numbers as the tables and the demo print them.

/// `12345.6` as `12,346`.
pub fn thousands(value: f64) -> String {
    let n = value.round() as u64;
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: rates print with thousands separators, rounded.
    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1234.5), "1,235");
        assert_eq!(thousands(12_345_678.0), "12,345,678");
    }
}
