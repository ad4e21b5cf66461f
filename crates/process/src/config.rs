//! Configuration errors are user errors: one line on stderr that names the
//! variable, exit code 2 ([`crate::exit::CONFIGURATION`]), never a backtrace.
//!
//! Every setting is an environment variable and the matching kebab-case flag
//! (clap's `env`). Clap's own value names are the variables' names, so its
//! first error line already names the variable; it is folded to one line here.

use clap::Parser;
use clap::error::ErrorKind;

/// Parses the command line and environment, or exits 2 with one line: a
/// `usage error` (with the `--help` to read) when the command line is wrong,
/// a `configuration error` when a variable is.
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
        Err(err) => {
            let argv: Vec<String> = std::env::args().skip(1).collect();
            let line = one_line(&err.render().to_string());
            if is_usage(&err, &argv) {
                let command = command_path(&T::command(), &argv);
                eprintln!("{program}: usage error: {line} (try `{program}{command} --help`)");
                std::process::exit(crate::exit::CONFIGURATION.into())
            }
            config_error(program, &line)
        }
    }
}

/// Whether the command line, not a variable, is what is wrong: an unknown
/// word, a missing or conflicting argument, or a bad value typed as a flag.
fn is_usage(err: &clap::Error, argv: &[String]) -> bool {
    use clap::error::ContextKind;
    match err.kind() {
        ErrorKind::UnknownArgument
        | ErrorKind::InvalidSubcommand
        | ErrorKind::MissingSubcommand
        | ErrorKind::ArgumentConflict
        | ErrorKind::TooManyValues
        | ErrorKind::WrongNumberOfValues
        | ErrorKind::NoEquals => true,
        _ => match err.get(ContextKind::InvalidArg) {
            // `--since <SINCE>`, `--limit <LIMIT>`: a flag the command line
            // carries; `<ID>`: a positional argument, only ever typed.
            Some(clap::error::ContextValue::String(arg)) => {
                let flag = arg.split([' ', '=']).next().unwrap_or(arg);
                !flag.starts_with('-')
                    || argv
                        .iter()
                        .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
            }
            Some(clap::error::ContextValue::Strings(args)) => args.iter().any(|a| !a.starts_with('-')),
            _ => false,
        },
    }
}

/// The subcommands the command line named (` events list`), for its `--help`.
fn command_path(command: &clap::Command, argv: &[String]) -> String {
    let mut path = String::new();
    let mut current = command;
    for word in argv.iter().filter(|a| !a.starts_with('-')) {
        match current.find_subcommand(word) {
            Some(sub) => {
                path.push(' ');
                path.push_str(sub.get_name());
                current = sub;
            }
            None => break,
        }
    }
    path
}

/// Prints `program: configuration error: message` and exits
/// [`crate::exit::CONFIGURATION`].
pub fn config_error(program: &str, message: &str) -> ! {
    crate::logs::flush();
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

    #[derive(Parser, Debug)]
    struct WithCommands {
        #[arg(long, env = "DEMO_COUNT", default_value_t = 3, global = true)]
        demo_count: u32,
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Show { id: u32 },
    }

    #[test]
    fn a_wrong_command_line_is_a_usage_error_and_a_wrong_variable_is_not() {
        let usage = |args: &[&str]| {
            let err = WithCommands::try_parse_from(args).unwrap_err();
            let argv: Vec<String> = args[1..].iter().map(|a| (*a).to_owned()).collect();
            (
                is_usage(&err, &argv),
                command_path(&<WithCommands as clap::CommandFactory>::command(), &argv),
            )
        };
        assert_eq!(usage(&["demo", "show", "x"]), (true, " show".to_owned()));
        assert_eq!(
            usage(&["demo", "show", "1", "--demo-count", "many"]),
            (true, " show".to_owned())
        );
        assert_eq!(usage(&["demo", "--bogus"]), (true, String::new()));
        // The same bad value, not on the command line (so from DEMO_COUNT):
        // a configuration error.
        let err = WithCommands::try_parse_from(["demo", "--demo-count", "many"]).unwrap_err();
        assert!(!is_usage(&err, &[]));
    }
}
