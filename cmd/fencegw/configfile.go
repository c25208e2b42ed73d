package main

// The configuration file (--config): YAML whose keys are serve's flag
// names, each taking what the flag takes (forward-timeout: 30s), a
// repeatable flag a list (upstream: [statements=http://10.0.0.5:8080]).
// Flags and FENCEGW_* variables override it. It is decoded strictly: a
// key that is not a flag, a key given twice, or a value of the wrong shape
// is an error naming it as it appears in the file (config.yaml:
// upstream[2]: …). go.yaml.in/yaml/v3 is the YAML library the auth file
// already uses (the YAML organisation's maintained fork of gopkg.in/yaml.v3).
//
// `fencegw config check FILE` reads it as serve would, with the files it
// names, without serving.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxConfigFile bounds the file read (a configuration is a few KiB).
const maxConfigFile = 1 << 20

// applyConfigFile sets each flag the file names and src does not (flags
// and variables win), recording in src where each value came from.
func applyConfigFile(fs *flag.FlagSet, path string, src sources) error {
	data, err := readConfigFile(path)
	if err != nil {
		return usageError("%s: %v", src.of("config"), err)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file: nothing set
		}
		return usageError("%s: not YAML: %v", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return usageError("%s: line %d: want a mapping of flag names to values (listen: 127.0.0.1:8080)", path, root.Line)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		name := k.Value
		if line, dup := seen[name]; dup {
			return usageError("%s: line %d: %s is given twice (first on line %d)", path, k.Line, name, line)
		}
		seen[name] = k.Line
		f := fs.Lookup(name)
		switch {
		case f == nil:
			return usageError("%s: line %d: %s is not a setting (the keys are serve's flag names without --; see fencegw serve --help)", path, k.Line, name)
		case name == "config":
			return usageError("%s: line %d: config: a configuration file cannot name another", path, k.Line)
		case src[name] != "":
			continue // a flag or variable overrides it
		}
		at := path + ": " + name
		src[name] = at
		if err := setFromYAML(f, v, at); err != nil {
			return err
		}
	}
	return nil
}

// setFromYAML sets f from v: a scalar, or for a repeatable flag a list of
// scalars (a scalar alone is a list of one).
func setFromYAML(f *flag.Flag, v *yaml.Node, at string) error {
	switch {
	case v.Kind == yaml.ScalarNode:
		if v.Tag == "!!null" {
			return usageError("%s: line %d: has no value", at, v.Line)
		}
		if err := f.Value.Set(v.Value); err != nil {
			return usageError("%s: %v", at, err)
		}
		return nil
	case v.Kind == yaml.SequenceNode && repeatable[f.Name]:
		for i, item := range v.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return usageError("%s[%d]: line %d: want a string", at, i, item.Line)
			}
			if err := f.Value.Set(item.Value); err != nil {
				return usageError("%s[%d]: %v", at, i, err)
			}
		}
		return nil
	case v.Kind == yaml.SequenceNode:
		return usageError("%s: line %d: takes one value, not a list", at, v.Line)
	}
	return usageError("%s: line %d: want a value like the flag's, not a mapping", at, v.Line)
}

func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigFile {
		return nil, fmt.Errorf("%s: larger than 1 MiB", path)
	}
	return data, nil
}

// configCheck is `fencegw config check FILE`: the file read as serve
// --config FILE would read it (the FENCEGW_* variables too), with the auth
// file and certificates it names, and nothing served.
func configCheck(args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "check" {
		return usageError("want: fencegw config check FILE")
	}
	cfg, err := parseServe([]string{"--config", args[1]}, getenv)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok (%d upstreams, %d routes", args[1], len(cfg.Upstreams), len(cfg.Routes))
	if cfg.Auth != nil {
		fmt.Fprintf(stdout, ", %d API keys", cfg.Auth.Keys.Len())
	}
	fmt.Fprintln(stdout, ")")
	return nil
}
