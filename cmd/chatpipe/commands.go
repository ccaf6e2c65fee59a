package main

// The command tree: every chatpipe command is one node of a tree of
// *ffcli.Command (github.com/peterbourgon/ff/v3/ffcli), made by
// newCommandTree. A command that takes flags declares them when it is
// made, in a flagSet that also holds the checks their values must pass, so
// every command's flags are known without running anything.
//
// chatpipe chooses a command by its exact name (find), as it always has:
// ffcli's own dispatch matches names case-insensitively and parses flags
// at every level (`chatpipe admin -h` would be help rather than an unknown
// admin command). Once chosen, a command is parsed and run by ffcli
// (Command.Parse, Command.Run), with the CHATPIPE_* environment and the
// config file as its ff options; config.go checks what they hold.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"
)

// flagSet is a command's flags, declared when the command is made, and
// the checks their values must pass once the command line, the CHATPIPE_*
// environment and the config file are applied.
type flagSet struct {
	*flag.FlagSet
	checks []flagCheck
	// known maps the flags of every chatpipe command to the commands that
	// have them (knownFlags); newCommandTree sets it.
	known map[string][]string
	// fileNotes are the last parse's notes on config keys that are flags
	// of other commands only.
	fileNotes []string
}

// newFlagSet returns the flag set of the command name ("worker", "admin
// shards"), with --config.
func newFlagSet(name string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs.String("config", "", "config file of name = value lines (flag names, without dashes); flags and CHATPIPE_* variables take precedence")
	return fs
}

// check adds checks that run once every source is applied.
func (fs *flagSet) check(checks ...flagCheck) {
	fs.checks = append(fs.checks, checks...)
}

// checkValues runs the checks and joins their errors.
func (fs *flagSet) checkValues() error {
	var errs []error
	for _, c := range fs.checks {
		if err := c(fs.FlagSet); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// options are the ff options of the command's parse: CHATPIPE_<FLAG>
// variables, and the config file that --config (or CHATPIPE_CONFIG) names.
func (fs *flagSet) options() []ff.Option {
	return []ff.Option{
		ff.WithEnvVarPrefix(strings.TrimSuffix(envPrefix, "_")),
		ff.WithConfigFileFlag("config"),
		ff.WithConfigFileParser(func(r io.Reader, set func(name, value string) error) error {
			notes, err := parseConfigFile(fs, fs.Lookup("config").Value.String(), r, set)
			fs.fileNotes = notes
			return err
		}),
	}
}

// A command is a chatpipe command that takes flags: its node in the
// command tree and its flag set.
type command struct {
	node  *ffcli.Command
	flags *flagSet
	// splitArgs, when set, returns the part of the arguments that is the
	// command's own, to parse; the command keeps the rest (admin
	// check-config: --role ROLE and ROLE's flags).
	splitArgs func(args []string) (own []string, err error)
}

// newCommand makes the command of fs (its name is the last word of fs's):
// help is its line in its parent's list of commands, exec what it runs
// once its flags are parsed and checked.
func newCommand(fs *flagSet, help string, exec func(ctx context.Context, args []string) error) *command {
	name := fs.Name()[strings.LastIndex(fs.Name(), " ")+1:]
	return &command{flags: fs, node: &ffcli.Command{
		Name: name, ShortHelp: help, FlagSet: fs.FlagSet, Options: fs.options(), UsageFunc: flagsUsage, Exec: exec,
	}}
}

// withUsage sets the text that -h prints before the flags (default "Usage
// of NAME:").
func (c *command) withUsage(text string) *command {
	c.node.LongHelp = text
	return c
}

// flagsUsage is what -h (or a bad flag) prints for a command with flags:
// its LongHelp, or "Usage of NAME:", then the flags and their defaults as
// the flag package lists them.
func flagsUsage(c *ffcli.Command) string {
	var b strings.Builder
	if c.LongHelp != "" {
		b.WriteString(c.LongHelp)
	} else {
		fmt.Fprintf(&b, "Usage of %s:\n", c.FlagSet.Name())
	}
	out := c.FlagSet.Output()
	c.FlagSet.SetOutput(&b)
	c.FlagSet.PrintDefaults()
	c.FlagSet.SetOutput(out)
	return strings.TrimSuffix(b.String(), "\n") // ffcli adds the last newline
}

// parse applies the command line args, the CHATPIPE_* environment and the
// config file, in that order of precedence, to c's flags and checks the
// result: a CHATPIPE_* variable or config key that no chatpipe command
// reads, a value not of its flag's type and a value out of range are
// errors. It returns c's node, parsed and ready to Run, and notes on the
// variables and keys that are flags of other commands only.
func (c *command) parse(args []string) (*ffcli.Command, []string, error) {
	fs := c.flags
	if c.splitArgs != nil {
		var err error
		if args, err = c.splitArgs(args); err != nil {
			return nil, nil, err
		}
	}
	notes, err := checkEnv(fs, os.Environ())
	if err != nil {
		return nil, nil, err
	}
	fs.fileNotes = nil
	// find chose the command by its exact name; without its subcommands
	// ffcli cannot take a stray argument for one's name.
	node := *c.node
	node.Subcommands = nil
	if err := node.Parse(args); err != nil {
		return nil, nil, parseError(err)
	}
	if err := fs.checkValues(); err != nil {
		return nil, nil, err
	}
	return &node, append(notes, fs.fileNotes...), nil
}

// commandTree is every chatpipe command as one ffcli tree, and the flag
// set of each command that takes flags.
type commandTree struct {
	root     *ffcli.Command
	commands map[*ffcli.Command]*command
	// known maps every flag of every command (but --config) to the
	// commands that have it.
	known map[string][]string
}

// newCommandTree makes every command, with fresh flag sets: the one list
// of chatpipe's commands, in the order its usage lists them.
func newCommandTree() *commandTree {
	t := &commandTree{commands: map[*ffcli.Command]*command{}}
	loadgen := newLoadgenCommand()
	loadgen.node.Subcommands = t.nodes(newLoadgenMergeCommand(), newLoadgenReportCommand())
	t.root = &ffcli.Command{
		Name:       "chatpipe",
		ShortUsage: "chatpipe <command> [flags]",
		UsageFunc:  rootUsage,
		Subcommands: slices.Concat(
			t.nodes(newDevCommand(), newGatewayCommand(), newWorkerCommand(), newPersistCommand(), newKafkaCommand(),
				newEtcdCommand(), newTokenCommand(), newInitCommand()),
			[]*ffcli.Command{newVersionCommand(), t.newAdminCommand()},
			t.nodes(newExportCommand(), newCheckCommand(), newClientCommand(), loadgen, newProbeCommand()),
		),
	}
	t.known = knownFlags(t)
	for _, c := range t.commands {
		c.flags.known = t.known
	}
	return t
}

// nodes records cmds as commands of t and returns their nodes.
func (t *commandTree) nodes(cmds ...*command) []*ffcli.Command {
	out := make([]*ffcli.Command, len(cmds))
	for i, c := range cmds {
		t.commands[c.node] = c
		out[i] = c.node
	}
	return out
}

// newAdminCommand makes chatpipe admin and its subcommands. admin itself
// takes no flags: its Exec answers arguments that name none of its
// subcommands.
func (t *commandTree) newAdminCommand() *ffcli.Command {
	admin := &ffcli.Command{
		Name:       "admin",
		ShortUsage: "chatpipe admin <command> [flags]",
		ShortHelp:  "operator commands: shards, handoff, check-config, rebuild",
		UsageFunc:  groupUsage,
		Subcommands: t.nodes(newShardsCommand(), newCheckConfigCommand(), newRebuildCommand(), newHandoffCommand(),
			newDeadLettersCommand(), newKafkaACLsCommand(), newHotCommand(), newIsolateCommand(), newUnisolateCommand()),
	}
	admin.Exec = func(_ context.Context, args []string) error {
		fmt.Fprint(os.Stderr, groupUsage(admin))
		if len(args) == 0 {
			return errors.New("missing admin command")
		}
		return fmt.Errorf("unknown admin command %q", args[0])
	}
	return admin
}

// newVersionCommand makes chatpipe version, which takes no flags and
// ignores its arguments.
func newVersionCommand() *ffcli.Command {
	return &ffcli.Command{Name: "version", ShortHelp: "print the version", Exec: runVersion}
}

// find returns the command that args name, word by word from the root by
// exact name, and the arguments after its name; the root if args[0] names
// no command.
func (t *commandTree) find(args []string) (*ffcli.Command, []string) {
	node := t.root
	for len(args) > 0 {
		var next *ffcli.Command
		for _, sub := range node.Subcommands {
			if sub.Name == args[0] {
				next = sub
				break
			}
		}
		if next == nil {
			break
		}
		node, args = next, args[1:]
	}
	return node, args
}

// run runs the command that args name: a command with flags once they are
// parsed and checked, admin and version with the rest of args as it is.
func (t *commandTree) run(ctx context.Context, args []string) error {
	node, rest := t.find(args)
	if node == t.root {
		return fmt.Errorf("unknown command %q", args[0])
	}
	c, ok := t.commands[node]
	if !ok {
		return node.Exec(ctx, rest)
	}
	parsed, _, err := c.parse(rest)
	if err != nil {
		return err
	}
	return parsed.Run(ctx)
}

// validate parses args (and the environment and config file) for the
// command that args name, as it would at start, and does not run it. It
// returns the command's flag set and notes on the variables and keys that
// are flags of other commands.
func (t *commandTree) validate(args []string) (*flag.FlagSet, []string, error) {
	node, rest := t.find(args)
	if node == t.root {
		return nil, nil, fmt.Errorf("unknown command %q", args[0])
	}
	c, ok := t.commands[node]
	if !ok {
		return nil, nil, fmt.Errorf("chatpipe %s takes no flags", strings.Join(args[:len(args)-len(rest)], " "))
	}
	_, notes, err := c.parse(rest)
	if err != nil {
		return nil, nil, err
	}
	return c.flags.FlagSet, notes, nil
}

// knownFlags maps every flag of every command of t (but --config) to the
// commands that have it.
func knownFlags(t *commandTree) map[string][]string {
	known := map[string][]string{}
	for _, c := range t.commands {
		c.flags.VisitAll(func(f *flag.Flag) {
			if f.Name != "config" {
				known[f.Name] = append(known[f.Name], c.flags.Name())
			}
		})
	}
	for _, cmds := range known {
		sort.Strings(cmds)
	}
	return known
}

const usageHead = `chatpipe — a chat message pipeline with one server order per conversation.

Usage: chatpipe <command> [flags]

Commands:
`

const usageTail = `
Every flag can also be set with CHATPIPE_<FLAG> (upper case, '-' as '_') or in
a config file (--config FILE or CHATPIPE_CONFIG: name = value lines); a flag
wins over its variable, a variable over the file. A CHATPIPE_ variable or a
config key that is a flag of no command, or a value out of range, is an error.
Run 'chatpipe <command> -h' for its flags and defaults.
`

// rootUsage is chatpipe's usage: every command and what it does.
func rootUsage(c *ffcli.Command) string {
	var b strings.Builder
	b.WriteString(usageHead)
	listCommands(&b, c.Subcommands, 9)
	b.WriteString(usageTail)
	return b.String()
}

// groupUsage is the usage of a command made of subcommands (admin).
func groupUsage(c *ffcli.Command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s\n\nCommands:\n", c.ShortUsage)
	listCommands(&b, c.Subcommands, 13)
	return b.String()
}

// listCommands writes a line for each command, its name padded to width
// and its ShortHelp; further lines of a ShortHelp are indented under its
// first.
func listCommands(w io.Writer, cmds []*ffcli.Command, width int) {
	for _, c := range cmds {
		lines := strings.Split(c.ShortHelp, "\n")
		fmt.Fprintf(w, "  %-*s %s\n", width, c.Name, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "%s%s\n", strings.Repeat(" ", width+3), l)
		}
	}
}
