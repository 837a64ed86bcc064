//! Reading rule arguments back from text: the tokenizer `iptables-restore` uses (blanks
//! separate, double quotes group, backslash escapes inside quotes) and the grammar of a
//! rule (`[!] -s`, `-d`, `-p`, `-m MODULE options`, `--dport` after its port module, `-j`).

use ipnet::IpNet;

use crate::model::{AddressMatch, Arg, PortTest, Protocol, Rule, parse_match, parse_target};

/// One word of a rule line; `quoted` words are never taken for an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub text: String,
    pub quoted: bool,
}

/// Splits a line into words the way `iptables-restore` does.
pub(crate) fn tokenize(line: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        let mut text = String::new();
        let quoted = first == '"';
        if quoted {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some(escaped) => text.push(escaped),
                        None => return Err("a backslash ends the line".into()),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    other => text.push(other),
                }
            }
            if !closed {
                return Err(format!("unterminated quote in {line:?}"));
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                text.push(c);
                chars.next();
            }
        }
        tokens.push(Token { text, quoted });
    }
    Ok(tokens)
}

fn is_rule_option(token: &Token) -> bool {
    !token.quoted
        && matches!(
            token.text.as_str(),
            "-s" | "--source"
                | "--src"
                | "-d"
                | "--destination"
                | "--dst"
                | "-p"
                | "--protocol"
                | "-i"
                | "--in-interface"
                | "-o"
                | "--out-interface"
                | "-f"
                | "--fragment"
                | "-m"
                | "--match"
                | "-j"
                | "--jump"
                | "-g"
                | "--goto"
        )
}

fn parse_net(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>().ok().or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

/// Parses the arguments of one rule (everything after `-A CHAIN`).
pub(crate) fn parse_rule_args(tokens: &[Token]) -> Result<Rule, String> {
    let mut rule = Rule::new();
    let mut i = 0;
    let word = |i: usize| tokens.get(i).map(|t| t.text.as_str());
    while i < tokens.len() {
        let mut negate = false;
        if word(i) == Some("!") && !tokens[i].quoted {
            negate = true;
            i += 1;
        }
        let Some(option) = word(i) else {
            return Err("a rule ends with `!`".into());
        };
        let value = |i: usize| word(i + 1).ok_or_else(|| format!("{option} needs a value"));
        match option {
            "-s" | "--source" | "--src" | "-d" | "--destination" | "--dst" => {
                let text = value(i)?;
                let is_source = option.starts_with("-s") || option == "--source" || option == "--src";
                match parse_net(text) {
                    Some(net) => {
                        let m = AddressMatch { negate, net };
                        rule.args.push(if is_source { Arg::Source(m) } else { Arg::Destination(m) });
                    }
                    None => {
                        let mut words = Vec::new();
                        if negate {
                            words.push("!".to_owned());
                        }
                        words.extend([option.to_owned(), text.to_owned()]);
                        rule.args.push(Arg::Other(words));
                    }
                }
                i += 2;
            }
            "-p" | "--protocol" => {
                let text = value(i)?;
                match Protocol::from_name(text) {
                    Some(protocol) if !negate => rule.args.push(Arg::Protocol(protocol)),
                    _ => {
                        let mut words = Vec::new();
                        if negate {
                            words.push("!".to_owned());
                        }
                        words.extend([option.to_owned(), text.to_owned()]);
                        rule.args.push(Arg::Other(words));
                    }
                }
                i += 2;
            }
            "-i" | "--in-interface" | "-o" | "--out-interface" => {
                let mut words = Vec::new();
                if negate {
                    words.push("!".to_owned());
                }
                words.extend([option.to_owned(), value(i)?.to_owned()]);
                rule.args.push(Arg::Other(words));
                i += 2;
            }
            "-f" | "--fragment" => {
                let mut words = Vec::new();
                if negate {
                    words.push("!".to_owned());
                }
                words.push(option.to_owned());
                rule.args.push(Arg::Other(words));
                i += 1;
            }
            "-m" | "--match" => {
                if negate {
                    return Err("`!` before -m".into());
                }
                let module = value(i)?.to_owned();
                i += 2;
                let mut options = Vec::new();
                while i < tokens.len() {
                    let token = &tokens[i];
                    let negated_rule_option =
                        token.text == "!" && !token.quoted && tokens.get(i + 1).is_some_and(is_rule_option);
                    if is_rule_option(token) || negated_rule_option {
                        break;
                    }
                    options.push(token.text.clone());
                    i += 1;
                }
                rule.args.push(Arg::Match(parse_match(&module, &options)));
            }
            "--dport" | "--destination-port" => {
                let text = value(i)?;
                let port = text.parse().map_err(|_| format!("--dport {text:?} is not a port"))?;
                rule.args.push(Arg::DestinationPort(PortTest { negate, port }));
                i += 2;
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                if negate {
                    return Err(format!("`!` before {option}"));
                }
                let name = value(i)?.to_owned();
                let options: Vec<String> = tokens[i + 2..].iter().map(|t| t.text.clone()).collect();
                let target = if option.starts_with("-g") || option == "--goto" {
                    if !options.is_empty() {
                        return Err("options after -g".into());
                    }
                    crate::model::Target::Goto(name)
                } else {
                    parse_target(&name, &options)
                };
                rule.target = Some(target);
                i = tokens.len();
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(rule)
}

/// Parses `ARGS` of a rule written on one line (restore or save spelling).
pub fn parse_rule(text: &str) -> Result<Rule, String> {
    parse_rule_args(&tokenize(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Family, Match, Target};

    #[test]
    fn a_quoted_comment_with_escapes_is_one_word() {
        let tokens = tokenize(r#"-m comment --comment "a \"b\" c" -j X"#).unwrap();
        assert_eq!(tokens[3].text, "a \"b\" c");
        assert!(tokens[3].quoted);
    }

    #[test]
    fn a_saved_rule_reads_back_as_the_rule_that_was_written() {
        let written = Rule::new()
            .comment("ns1/svc1:p80 cluster IP")
            .protocol(Protocol::Tcp)
            .destination("172.30.0.41".parse::<std::net::IpAddr>().unwrap())
            .destination_port(80)
            .not_source("10.0.0.0/8".parse::<IpNet>().unwrap())
            .jump("KUBE-MARK-MASQ");
        for text in [written.restore_args(), written.save_args(Family::V4)] {
            let read = parse_rule(&text).unwrap();
            assert!(read.same_as(&written, Family::V4), "{text}");
        }
    }

    #[test]
    fn a_negated_module_option_stays_with_its_module() {
        let rule = parse_rule("-m mark ! --mark 0x4000/0x4000 ! -s 10.0.0.0/8 -j RETURN").unwrap();
        assert_eq!(rule.args[0], Arg::Match(Match::Mark { negate: true, value: 0x4000, mask: 0x4000 }));
        assert!(matches!(rule.args[1], Arg::Source(AddressMatch { negate: true, .. })));
        assert_eq!(rule.target, Some(Target::Return));
    }

    #[test]
    fn unknown_modules_and_options_are_kept_verbatim() {
        let rule = parse_rule("-i docker0 -m set --match-set X dst -j DOCKER").unwrap();
        assert_eq!(rule.args[0], Arg::Other(vec!["-i".into(), "docker0".into()]));
        assert!(matches!(&rule.args[1], Arg::Match(Match::Other { module, .. }) if module == "set"));
        assert_eq!(rule.save_args(Family::V4), "-i docker0 -m set --match-set X dst -j DOCKER");
    }
}
