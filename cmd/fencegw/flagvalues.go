package main

// The values of serve's flags whose mistakes deserve a hint: durations
// without a unit, numbers that are not, log levels, listen addresses that
// are a port alone, store URLs that are an address alone. Each Set error
// says what is wrong and what would be right; parseServe puts the flag's
// name in front, as the user wrote it (--x, FENCEGW_X or FILE: x).

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// duration is a time.Duration flag whose error says what a duration is.
type duration struct{ d *time.Duration }

func (v duration) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v duration) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err == nil {
		*v.d = d
		return nil
	}
	if _, numErr := strconv.ParseFloat(strings.TrimSpace(s), 64); numErr == nil {
		return fmt.Errorf("%q: a duration needs a unit, e.g. %ss", s, strings.TrimSpace(s))
	}
	return fmt.Errorf("%q is not a duration (like 30s, 1m30s or 500ms)", s)
}

// integer is an int flag whose error says it wants a whole number.
type integer struct{ n *int }

func (v integer) String() string {
	if v.n == nil {
		return ""
	}
	return strconv.Itoa(*v.n)
}

func (v integer) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	*v.n = n
	return nil
}

// boolean is a bool flag (--x alone means true) with a plain error.
type boolean struct{ b *bool }

func (v boolean) String() string {
	if v.b == nil {
		return "false"
	}
	return strconv.FormatBool(*v.b)
}

func (v boolean) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*v.b = b
	return nil
}

// IsBoolFlag lets --x stand for --x=true.
func (boolean) IsBoolFlag() bool { return true }

// logLevels are --log-level's choices.
const logLevels = "debug, info, warn or error"

// logLevel is --log-level.
type logLevel struct{ s *string }

func (v logLevel) String() string {
	if v.s == nil {
		return ""
	}
	return *v.s
}

func (v logLevel) Set(s string) error {
	if _, err := parseLevel(s); err != nil || s == "" {
		return fmt.Errorf("%q is not a log level: choose %s", s, logLevels)
	}
	*v.s = s
	return nil
}

// address is --listen: HOST:PORT.
type address struct{ s *string }

func (v address) String() string {
	if v.s == nil {
		return ""
	}
	return *v.s
}

func (v address) Set(s string) error {
	s = strings.TrimSpace(s)
	if _, err := strconv.Atoi(s); err == nil {
		return fmt.Errorf("%q is a port alone; an address is HOST:PORT, e.g. 127.0.0.1:%s (0.0.0.0:%s for every interface)", s, s, s)
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return fmt.Errorf("%q is not HOST:PORT, e.g. 127.0.0.1:8080", s)
	}
	// A port out of range, or a name no services entry has, would pass
	// to net.Listen and fail there, after the store was opened, named as
	// net's "address 99999: invalid port" rather than as the flag.
	if n, err := strconv.Atoi(port); err == nil {
		if n < 0 || n > 65535 {
			return fmt.Errorf("%q: port %d is out of range (0 to 65535; 0 picks a free one)", s, n)
		}
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q: %q is not a port number (0 to 65535)", s, port)
	}
	*v.s = s
	return nil
}

// storeURL is --postgres or --redis: a URL of the scheme's store, checked
// for its shape here (the driver checks the rest when it opens it).
type storeURL struct {
	s       *string
	schemes []string // the first is the example's
	example string   // host:port/rest for the example
}

func (v storeURL) String() string {
	if v.s == nil {
		return ""
	}
	return *v.s
}

func (v storeURL) Set(s string) error {
	s = strings.TrimSpace(s)
	want := fmt.Sprintf("want a URL like %s://%s", v.schemes[0], v.example)
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" && u.Opaque != "" {
		if v.schemes[0] == "postgres" && strings.Contains(s, "=") && !strings.Contains(s, "://") {
			*v.s = s // key=value settings (host=… dbname=…), which the driver takes too
			return nil
		}
		return fmt.Errorf("%s is not a URL; %s", hidePassword(s), want)
	}
	for _, scheme := range v.schemes {
		if u.Scheme == scheme {
			*v.s = s
			return nil
		}
	}
	return fmt.Errorf("%s: the scheme must be %s; %s", hidePassword(s), strings.Join(v.schemes, " or "), want)
}

// hidePassword is a store URL as it may be shown: its password replaced.
func hidePassword(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return strconv.Quote(s)
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return strconv.Quote(u.Redacted())
}

// errSeeHelp ends a line about a flag that does not exist or lacks its
// value.
var errSeeHelp = errors.New("see fencegw serve --help")
