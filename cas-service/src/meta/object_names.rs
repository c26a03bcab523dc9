//! The objects of an upload generation's publication attempts: each attempt writes an object
//! of its own, named after the generation and the attempt, so that no two attempts (a retry
//! beside a late first try) ever write the same object.

use super::generations::Generation;

impl Generation {
    /// The name of the object that publication attempt `self.attempt` writes (the object part
    /// of its node key and the row's `object_gen`): the generation id for the first attempt,
    /// `<id>.<k>` for a later one, so that no two attempts write the same object.
    pub fn object_name(&self) -> String {
        attempt_object(&self.gen_id, self.attempt)
    }

    /// The objects every attempt so far may have written.
    pub fn attempt_objects(&self) -> impl Iterator<Item = String> + '_ {
        (1..=self.attempt.max(1)).map(|k| attempt_object(&self.gen_id, k))
    }
}

fn attempt_object(gen_id: &str, attempt: i64) -> String {
    if attempt <= 1 {
        gen_id.to_string()
    } else {
        format!("{gen_id}.{attempt}")
    }
}

/// The generation and attempt an object name stands for (see [`Generation::object_name`]);
/// `None` for a name no attempt writes.
pub fn parse_object_name(name: &str) -> Option<(&str, i64)> {
    let (gen_id, attempt) = match name.split_once('.') {
        None => (name, 1),
        Some((gen_id, k)) => (gen_id, k.parse::<i64>().ok()?),
    };
    (attempt >= 1 && attempt_object(gen_id, attempt) == name).then_some((gen_id, attempt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{GenState, TargetKind};
    use cas_format::Hash;

    #[test]
    fn each_attempt_names_an_object_of_its_own() {
        let g = |attempt| Generation {
            gen_id: "01J0ABC".into(),
            hash: Hash::digest(b"x"),
            state: GenState::Validated,
            target: TargetKind::Service,
            created_at: 0,
            url_expires_at: 0,
            expires_at: 0,
            reserved_bytes: 0,
            evidence: None,
            attempt,
        };
        // Generations from before attempts were counted wrote at the generation's key.
        assert_eq!(g(0).object_name(), "01J0ABC");
        assert_eq!(g(1).object_name(), "01J0ABC");
        assert_eq!(g(3).object_name(), "01J0ABC.3");
        assert_eq!(
            g(3).attempt_objects().collect::<Vec<_>>(),
            ["01J0ABC", "01J0ABC.2", "01J0ABC.3"]
        );
        assert_eq!(g(0).attempt_objects().count(), 1);
        for k in 1..5 {
            assert_eq!(parse_object_name(&g(k).object_name()), Some(("01J0ABC", k)));
        }
        for bad in [
            "01J0ABC.1",
            "01J0ABC.+2",
            "01J0ABC.02",
            "01J0ABC.x",
            "01J0ABC.-2",
            "a.2.3",
        ] {
            assert_eq!(parse_object_name(bad), None, "{bad}");
        }
    }
}
