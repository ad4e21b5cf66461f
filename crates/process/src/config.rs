//! Configuration errors are user errors: one line on stderr that names the
//! variable, exit code 2 ([`crate::exit::CONFIGURATION`]), never a backtrace.
//!
//! Every setting is an environment variable and the matching kebab-case flag
//! (clap's `env`). Clap's own value names are the variables' names, so its
//! first error line already names the variable; it is folded to one line here.

use clap::Parser;
use clap::error::ErrorKind;

/// Parses the command line and environment, or exits 2 with one line.
pub fn parse_or_exit<T: Parser>(program: &str) -> T {
    match T::try_parse() {
        Ok(parsed) => parsed,
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            err.exit()
        }
        Err(err) => config_error(program, &one_line(&err.render().to_string())),
    }
}

/// Prints `program: configuration error: message` and exits
/// [`crate::exit::CONFIGURATION`].
pub fn config_error(program: &str, message: &str) -> ! {
    eprintln!("{program}: configuration error: {message}");
    std::process::exit(crate::exit::CONFIGURATION.into())
}

/// Clap's error without its usage and help hints, on one line.
fn one_line(rendered: &str) -> String {
    let body = rendered
        .split("\n\nUsage:")
        .next()
        .unwrap_or(rendered)
        .split("\n\nFor more information")
        .next()
        .unwrap_or(rendered);
    let body = body.trim().strip_prefix("error: ").unwrap_or(body.trim());
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser, Debug)]
    struct Demo {
        #[arg(long, env = "DEMO_REQUIRED_SECRET")]
        demo_required_secret: String,
        #[arg(long, env = "DEMO_COUNT", default_value_t = 3)]
        demo_count: u32,
    }

    #[test]
    fn errors_fold_to_one_line_naming_the_variable() {
        let err = Demo::try_parse_from(["demo"]).unwrap_err();
        let line = one_line(&err.render().to_string());
        assert!(!line.contains('\n'));
        assert!(line.contains("DEMO_REQUIRED_SECRET"), "{line}");
        let err = Demo::try_parse_from(["demo", "--demo-required-secret", "x", "--demo-count", "many"])
            .unwrap_err();
        let line = one_line(&err.render().to_string());
        assert!(line.contains("DEMO_COUNT") && line.contains("many"), "{line}");
        assert!(!line.contains("Usage") && !line.contains("--help"), "{line}");
    }
}
