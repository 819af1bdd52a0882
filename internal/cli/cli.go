// Package cli holds what kiln's mage targets share: flag values to engine
// options, quiet-unless-verbose logging, exit codes, and the plan's text
// and JSON renderings. It owns no stage.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/magefile/mage/mg"
	"github.com/sirupsen/logrus"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/publish"
	"github.com/kiln-build/kiln/internal/session"
)

// Logging is quiet unless mage runs with -v.
func Logging() {
	logrus.SetOutput(os.Stderr)
	logrus.SetLevel(logrus.WarnLevel)
	logrus.SetFormatter(PlainFormatter{Levels: mg.Verbose()})
	if mg.Verbose() {
		logrus.SetLevel(logrus.InfoLevel)
	}
}

// WriteMetadata writes what a target made as JSON to path (-metadata), whole
// or not at all, as buildx's --metadata-file and goreleaser's
// artifacts.json do for theirs.
func WriteMetadata(path string, v any) error {
	if path == "" {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, func(w io.Writer) error { _, err := w.Write(append(data, '\n')); return err }); err != nil {
		return fmt.Errorf("-metadata=%s: %w", path, err)
	}
	return nil
}

// PlainFormatter prints a log record as one plain line, as go and buildx
// print theirs: the message and its fields, the level only with Levels
// (under -v), no time.
type PlainFormatter struct{ Levels bool }

func (f PlainFormatter) Format(e *logrus.Entry) ([]byte, error) {
	var b bytes.Buffer
	if f.Levels {
		b.WriteString(e.Level.String() + ": ")
	}
	b.WriteString(strings.TrimRight(e.Message, "\n"))
	for _, k := range slices.Sorted(maps.Keys(e.Data)) {
		fmt.Fprintf(&b, " %s=%v", k, e.Data[k])
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// Interrupted gives an error the exit code 130 when Ctrl-C (or mage -t)
// cancelled the target, as shells expect of an interrupted command.
func Interrupted(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return mg.Fatalf(130, "interrupted: %v", err)
	}
	return err
}

// Str is a string flag's value, "" when it was not given.
func Str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// Bool is a boolean flag's value, false when it was not given.
func Bool(p *bool) bool { return p != nil && *p }

// List splits a comma-separated flag; nil when it was not given.
func List(p *string) []string {
	if p == nil || *p == "" {
		return nil
	}
	return strings.Split(*p, ",")
}

// Options are the build options every building target shares.
func Options(platforms *string, stamp *bool, progress *string) session.Options {
	Logging()
	return session.Options{Platforms: Str(platforms), Stamp: Bool(stamp), Progress: Str(progress)}
}

// LoadOptions say where images:load and images:smoke find containerd.
func LoadOptions(address, namespace *string) publish.LoadOptions {
	return publish.LoadOptions{Address: Str(address), Namespace: Str(namespace)}
}
