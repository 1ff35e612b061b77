//! A child process's wall clock under the test's control, through
//! libfaketime (Debian's `faketime` package): the real binary reads its
//! time as it always does, and the test steps that time forward or back
//! while it runs, as an operator or a misbehaving NTP client would. Only
//! the wall clock moves; the monotonic clock is left alone, as a real step
//! leaves it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use harness::process::Env;

/// Where Debian's `libfaketime` package puts the library.
const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The tool a [`FakeClock`] needs, and how to get it: what a test names
/// when it skips without one ([`crate::tools::skip_without`]).
pub const TOOL: &str = "libfaketime (apt-get install faketime, or set FAKETIME_LIB)";

/// One process's wall-clock offset, kept in a file libfaketime re-reads on
/// every clock call; removed on drop.
pub struct FakeClock {
    library: PathBuf,
    file: PathBuf,
}

impl FakeClock {
    /// A clock at offset 0; `None` if libfaketime is not installed (then a
    /// test skips, through [`crate::tools::skip_without`]). `FAKETIME_LIB` names the library
    /// elsewhere.
    pub fn new() -> Option<Self> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let library =
            std::env::var_os("FAKETIME_LIB").map_or_else(|| PathBuf::from(LIBRARY), PathBuf::from);
        if !library.exists() {
            return None;
        }
        let file = std::env::temp_dir().join(format!(
            "escrow-faketime-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let clock = Self { library, file };
        clock.set_offset_s(0);
        Some(clock)
    }

    /// The environment that makes a child process read its wall clock
    /// from this one.
    pub fn env(&self) -> Env {
        [
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
        .into_iter()
        .map(|(name, value): (&str, OsString)| (name.to_owned(), value))
        .collect()
    }

    /// Steps the wall clock to `offset_s` seconds from the real time (the
    /// process sees it at its next clock read).
    pub fn set_offset_s(&self, offset_s: i64) {
        // Written aside and renamed over: a reader never sees half a file.
        let next = self.file.with_extension("next");
        std::fs::write(&next, format!("{offset_s:+}\n")).unwrap();
        std::fs::rename(&next, &self.file).unwrap();
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}
