//! Inputs the API and the CLI both parse, with one set of rules and one error text.

use opledger_domain::error::ValidationError;

/// The longest duration a filter takes: a hundred years.
const MAX_DURATION_DAYS: i64 = 100 * 365;

/// Parses `500ms`, `10s`, `10m`, `2h`, `3d` (a positive whole number and one unit).
pub fn parse_duration(flag: &str, text: &str) -> Result<chrono::Duration, ValidationError> {
    let text = text.trim();
    let invalid = |why: &str| {
        ValidationError::new(
            flag,
            format!(
                "`{text}` {why}; write a whole number and a unit ms, s, m, h or d, e.g. 500ms, 10m, 2h, 3d"
            ),
        )
    };
    if text.is_empty() {
        return Err(invalid("is empty"));
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '-' && c != '+')
        .ok_or_else(|| invalid("has no unit"))?;
    let (number, unit) = text.split_at(split);
    let millis_per_unit: i64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid("has no unit")),
    };
    let amount: i64 = number
        .parse()
        .map_err(|_| invalid("does not start with a whole number"))?;
    if amount <= 0 {
        return Err(invalid("is not positive"));
    }
    let millis = amount
        .checked_mul(millis_per_unit)
        .filter(|millis| *millis <= MAX_DURATION_DAYS * 86_400_000)
        .ok_or_else(|| invalid(&format!("is longer than {MAX_DURATION_DAYS} days")))?;
    Ok(chrono::Duration::milliseconds(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_number_and_one_unit() {
        assert_eq!(
            parse_duration("older_than", "500ms").map(|d| d.num_milliseconds()),
            Ok(500)
        );
        assert_eq!(
            parse_duration("--older-than", "10m").map(|d| d.num_seconds()),
            Ok(600)
        );
        assert_eq!(
            parse_duration("--older-than", "3d").map(|d| d.num_seconds()),
            Ok(259_200)
        );
        for bad in [
            "",
            "10",
            "m",
            "-5m",
            "0s",
            "1.5h",
            "10x",
            "99999999999d",
            "5 m",
            "5mss",
            "ms",
        ] {
            let error = parse_duration("--older-than", bad).expect_err(bad);
            assert_eq!(error.field, "--older-than", "{bad}");
        }
    }
}
