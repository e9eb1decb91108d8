//! [`Problems`]: what a section's check collects, `(dotted key, message)` in the order found,
//! for the loader to attach the value's source to each (`load.rs`).

/// The problems one check found, in order.
#[derive(Debug, Default)]
pub struct Problems(Vec<(String, String)>);

impl Problems {
    /// Records that `key` (full dotted key, `pipeline.max_pending`) is wrong, and why.
    pub fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push((key.into(), message.into()));
    }

    /// Appends another check's problems.
    pub fn extend(&mut self, more: Vec<(String, String)>) {
        self.0.extend(more);
    }

    /// The problems, in the order found.
    pub fn into_vec(self) -> Vec<(String, String)> {
        self.0
    }
}
