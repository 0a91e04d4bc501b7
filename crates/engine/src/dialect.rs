//! Basin SQL statements DataFusion does not plan itself, rewritten to the queries that
//! answer them, and `?` parameters numbered. Everything else goes to DataFusion unchanged.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// The rewritten SQL, or `None` when the statement needs no rewriting.
pub fn rewrite(sql: &str) -> Option<String> {
    let words: Vec<String> =
        sql.trim().trim_end_matches(';').split_whitespace().map(|w| w.to_ascii_uppercase()).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["SHOW", "DATABASES" | "NAMESPACES" | "SCHEMAS"] => Some(format!(
            "SELECT schema_name AS namespace FROM information_schema.schemata \
             WHERE catalog_name = '{}' AND schema_name <> 'information_schema' ORDER BY 1",
            super::CATALOG
        )),
        ["SHOW", "TABLES", "IN" | "FROM", _] => {
            let ns = sql.trim().trim_end_matches(';').split_whitespace().nth(3)?;
            let ns = ns.trim_matches('"').replace('\'', "''");
            Some(format!(
                "SELECT table_schema AS namespace, table_name FROM information_schema.tables \
                 WHERE table_catalog = '{}' AND table_schema = '{ns}' ORDER BY 2",
                super::CATALOG
            ))
        }
        _ => None,
    }
}

/// JDBC and ADBC clients write positional parameters as `?`; DataFusion plans numbered ones
/// (`$1`, `$2`, ...). The tokenizer finds the real placeholders (not a `?` in a string or
/// comment), and only those characters are replaced, so the rest of the text is untouched.
pub fn number_placeholders(sql: &str) -> Option<String> {
    if !sql.contains('?') {
        return None;
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location().ok()?;
    let marks: Vec<_> = tokens
        .iter()
        .filter(|t| matches!(&t.token, Token::Placeholder(p) if p == "?"))
        .map(|t| t.span.start)
        .collect();
    if marks.is_empty() {
        return None;
    }
    let line_starts: Vec<usize> =
        std::iter::once(0).chain(sql.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let mut out = String::with_capacity(sql.len() + marks.len() * 2);
    let mut last = 0;
    for (n, loc) in marks.iter().enumerate() {
        // Locations are 1-based lines and 1-based columns counted in characters.
        let start = *line_starts.get((loc.line as usize).checked_sub(1)?)?;
        let (i, c) = sql[start..].char_indices().nth((loc.column as usize).checked_sub(1)?)?;
        if c != '?' || start + i < last {
            return None;
        }
        out.push_str(&sql[last..start + i]);
        out.push('$');
        out.push_str(&(n + 1).to_string());
        last = start + i + 1;
    }
    out.push_str(&sql[last..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_marks_are_numbered() {
        assert_eq!(
            number_placeholders("SELECT ? AS a, '?' AS b -- ?\nFROM t WHERE x = ? AND y = 'é?'").as_deref(),
            Some("SELECT $1 AS a, '?' AS b -- ?\nFROM t WHERE x = $2 AND y = 'é?'")
        );
        assert_eq!(number_placeholders("SELECT 'é', ?").as_deref(), Some("SELECT 'é', $1"));
        assert_eq!(number_placeholders("SELECT '?'"), None);
        assert_eq!(number_placeholders("SELECT 1"), None);
    }

    #[test]
    fn rewrites() {
        assert!(rewrite("show databases;").unwrap().contains("information_schema.schemata"));
        assert!(rewrite("SHOW NAMESPACES").is_some());
        assert!(rewrite("SHOW TABLES IN glass").unwrap().contains("table_schema = 'glass'"));
        assert!(rewrite("SHOW TABLES IN gl'ass").unwrap().contains("'gl''ass'"));
        assert_eq!(rewrite("SELECT 1"), None);
        assert_eq!(rewrite("SHOW TABLES"), None);
    }
}
