package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Every key of config.yaml can be given without editing the file, on the
// command line and in the environment, in one scheme:
//
//	-set section.key=value                  (repeatable)
//	LOCKPROXY_SECTION_KEY=value             (the key in upper case, dots as underscores)
//
// for example -set metrics.listen=127.0.0.1:9381 and
// LOCKPROXY_LOCK_NODE_TIMEOUT=100ms. The value is what the file would hold
// after the key: a string is taken as it is (no quotes needed), a duration
// as 250ms, a list in flow style ([a, b]) or comma-separated (a,b), a map in
// flow style ({alice: secret}); one entry of a map is section.key.name=value
// (-set auth.users.alice=secret). Each value is decoded by the decoder that
// reads the file, into the same field, so it is checked the same way and a
// bad one gets the same message. An unknown key, in the file, a flag or a
// LOCKPROXY_ variable, stops the proxy.
//
// Precedence: the defaults, then the file, then the environment, then the
// flags in the order given. -listen, -backend, -lock-nodes and -log-level
// are short for -set listen=, -set backend.addr=, -set lock.nodes= and
// -set log.level=.

// envPrefix starts the name of every environment variable that sets a key.
const envPrefix = "LOCKPROXY_"

// override is one key set outside the file.
type override struct {
	source string // where it came from, for messages: "-set lock.max_ttl", "LOCKPROXY_LOCK_MAX_TTL"
	key    string // the key's path in the file: "lock.max_ttl"
	value  string
}

// options is what the command line asks for.
type options struct {
	path        string
	flags       []override // in the order given
	version     bool
	printConfig bool
}

// errHelp ends run without an error after -h printed the usage.
var errHelp = flag.ErrHelp

// parseArgs parses the command line. Usage and flag errors go to stderr.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("lockproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: lockproxy [flags]

Every key of the configuration file can also be set with -set section.key=value
or the environment variable LOCKPROXY_SECTION_KEY=value (for example
-set metrics.listen=127.0.0.1:9381, LOCKPROXY_LOCK_NODE_TIMEOUT=100ms).
Precedence: file < environment < flags. -print-config shows the result.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.path, "config", "config.yaml", "configuration `file`")
	fs.Func("set", "set a key of the configuration file: `section.key=value` (repeatable)", func(s string) error {
		key, value, ok := strings.Cut(s, "=")
		if !ok || key == "" {
			return fmt.Errorf("%q: want section.key=value", s)
		}
		o.flags = append(o.flags, override{source: "-set " + key, key: key, value: value})
		return nil
	})
	for _, alias := range []struct{ flag, key, usage string }{
		{"listen", "listen", "`address` to listen on (-set listen=...)"},
		{"backend", "backend.addr", "backend Redis `address` (-set backend.addr=...)"},
		{"lock-nodes", "lock.nodes", "comma-separated lock node `addresses` (-set lock.nodes=...)"},
		{"log-level", "log.level", "`level`: debug, info, warn or error (-set log.level=...)"},
	} {
		fs.Func(alias.flag, alias.usage, func(v string) error {
			o.flags = append(o.flags, override{source: "-" + alias.flag, key: alias.key, value: v})
			return nil
		})
	}
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.printConfig, "print-config", false, "print the effective configuration (secrets masked) and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return o, nil
}

// envOverrides returns the overrides in env (as os.Environ returns it),
// sorted by name. A LOCKPROXY_ variable that names no key is an error.
func envOverrides(env []string) ([]override, error) {
	keys := make(map[string]string)
	for _, k := range fileKeys() {
		keys[envName(k)] = k
	}
	var (
		out  []override
		errs []error
	)
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) {
			continue
		}
		key, ok := keys[name]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: no such key in the configuration (LOCKPROXY_SECTION_KEY sets section.key)", name))
			continue
		}
		out = append(out, override{source: name, key: key, value: value})
	}
	slices.SortFunc(out, func(a, b override) int { return strings.Compare(a.source, b.source) })
	return out, errors.Join(errs...)
}

// envName is the environment variable that sets key.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// fileKeys lists every key of the file that holds a value (not a
// section), in the order of fileConfig.
func fileKeys() []string {
	var keys []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			key := prefix + yamlName(f)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, key+".")
				continue
			}
			keys = append(keys, key)
		}
	}
	walk(reflect.TypeFor[fileConfig](), "")
	return keys
}

// yamlName is the key of a field in the file.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

// apply decodes o's value into its field of cfg, replacing what the field
// held.
func (o override) apply(cfg *fileConfig) error {
	path := strings.Split(o.key, ".")
	v := reflect.ValueOf(cfg).Elem()
	for i, name := range path {
		switch {
		case v.Kind() == reflect.Struct:
			f, ok := fieldByKey(v, name)
			if !ok {
				return fmt.Errorf("%s: %w", o.source, unknownKey(v.Type(), name))
			}
			v = f
		case v.Kind() == reflect.Map && i == len(path)-1:
			// One entry of a map: auth.users.alice.
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := decodeValue(o.value, elem); err != nil {
				return fmt.Errorf("%s: %w", o.source, err)
			}
			if v.IsNil() {
				v.Set(reflect.MakeMap(v.Type()))
			}
			v.SetMapIndex(reflect.ValueOf(name), elem)
			return nil
		default:
			return fmt.Errorf("%s: %s holds a value, not keys", o.source, strings.Join(path[:i], "."))
		}
	}
	if v.Kind() == reflect.Struct {
		return fmt.Errorf("%s: %s is a section: set its keys one by one", o.source, o.key)
	}
	fresh := reflect.New(v.Type()).Elem()
	if err := decodeValue(o.value, fresh); err != nil {
		return fmt.Errorf("%s: %w", o.source, err)
	}
	v.Set(fresh)
	return nil
}

// unknownKey is the decoder's error for the key name in a section of type
// t, which has no such key: the words the file gets for it.
func unknownKey(t reflect.Type, name string) error {
	doc, err := yaml.Marshal(map[string]any{name: nil})
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(reflect.New(t).Interface()); err != nil {
		return withoutLines(err)
	}
	return fmt.Errorf("field %s not found in type %s", name, t) // not reached
}

// fieldByKey returns the field of the struct v whose key is name.
func fieldByKey(v reflect.Value, name string) (reflect.Value, bool) {
	for i := range v.NumField() {
		if yamlName(v.Type().Field(i)) == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// decodeValue decodes value, written as in the file, into dst with the
// file's decoder. Strings are taken literally, so that a password or
// "lockproxy:" needs no quoting; a list of strings may be comma-separated.
func decodeValue(value string, dst reflect.Value) error {
	var n *yaml.Node
	trimmed := strings.TrimSpace(value)
	switch {
	case dst.Kind() == reflect.String:
		n = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
	case dst.Kind() == reflect.Slice && dst.Type().Elem().Kind() == reflect.String && !strings.ContainsAny(trimmed[:min(len(trimmed), 1)], "[{"):
		n = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if trimmed != "" {
			for item := range strings.SplitSeq(value, ",") {
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: strings.TrimSpace(item)})
			}
		}
	default:
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(value), &doc); err != nil {
			return err
		}
		n = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str"} // an empty value
		if len(doc.Content) > 0 {
			n = doc.Content[0]
		}
	}
	return withoutLines(n.Decode(dst.Addr().Interface()))
}

// withoutLines returns the decoder's error without its line numbers, which
// count the lines of a value given alone, not of a file.
func withoutLines(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	stripped := &yaml.TypeError{}
	for _, e := range te.Errors {
		stripped.Errors = append(stripped.Errors, lineNumber.ReplaceAllString(e, ""))
	}
	return stripped
}

// lineNumber starts a message of the yaml decoder.
var lineNumber = regexp.MustCompile(`^line \d+: `)

// masked is what -print-config shows for a secret that is set.
const masked = "********"

// printConfig writes cfg as the file would hold it, with every field
// tagged secret masked (passwords, users' passwords, TLS key files).
func printConfig(w io.Writer, cfg *fileConfig) error {
	c := *cfg
	mask(reflect.ValueOf(&c).Elem())
	fmt.Fprintln(w, "# lockproxy: the effective configuration (file, environment, flags); secrets masked")
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return err
	}
	return enc.Close()
}

// maskRules masks the passwords and password hashes of an ACL rule line
// (>password, <password, #hash, !hash).
func maskRules(line string) string {
	words := strings.Fields(line)
	for i, w := range words {
		if len(w) > 1 && strings.ContainsRune("><#!", rune(w[0])) {
			words[i] = w[:1] + masked
		}
	}
	return strings.Join(words, " ")
}

// mask masks the secret fields of the struct v, which must be a copy: a map
// is replaced, not changed.
func mask(v reflect.Value) {
	for i := range v.NumField() {
		f, secret := v.Field(i), v.Type().Field(i).Tag.Get("secret") == "true"
		switch {
		case f.Kind() == reflect.Struct:
			mask(f)
		case !secret:
		case f.Kind() == reflect.String && f.String() != "":
			f.SetString(masked)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String && f.Len() > 0:
			// ACL rules: the passwords in them.
			l := reflect.MakeSlice(f.Type(), f.Len(), f.Len())
			for j := range f.Len() {
				l.Index(j).SetString(maskRules(f.Index(j).String()))
			}
			f.Set(l)
		case f.Kind() == reflect.Map && f.Len() > 0:
			m := reflect.MakeMapWithSize(f.Type(), f.Len())
			for it := f.MapRange(); it.Next(); {
				m.SetMapIndex(it.Key(), reflect.ValueOf(masked))
			}
			f.Set(m)
		}
	}
}
