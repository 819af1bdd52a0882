// Package yamlref rewrites image references in YAML files in place: the
// bases images:pin pins in image.yaml and the references images:resolve
// pins in Kubernetes manifests. Only the replaced scalars change; every
// other byte (comments, order, quoting, the documents of a stream) stays.
package yamlref

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/distribution/reference"
	"go.yaml.in/yaml/v3"
)

// Documents parses every document of a YAML stream.
func Documents(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, &doc)
	}
}

// Replacement gives a scalar node of data a new value.
type Replacement struct {
	Node  *yaml.Node
	Value string
}

// Apply writes the replacements into data at their scalars' positions,
// keeping their quoting, anchors and tags. It refuses a scalar whose text
// in the file is not its value (escapes, or a plain scalar folded over
// lines): a rewrite there could not keep the rest byte for byte.
func Apply(data []byte, reps []Replacement) ([]byte, error) {
	type span struct {
		start, end int
		value      string
		line       int
	}
	var spans []span
	for _, r := range reps {
		n := r.Node
		if n.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("line %d: not a scalar", n.Line)
		}
		start, ok := offset(data, n.Line, n.Column)
		if !ok {
			return nil, fmt.Errorf("line %d column %d: outside the file (lines must end in \\n or \\r\\n)", n.Line, n.Column)
		}
		// The node starts at its anchor or tag (&a, !!str), if any.
		for start < len(data) && (data[start] == '&' || data[start] == '!') {
			for start < len(data) && data[start] != ' ' && data[start] != '\t' && data[start] != '\n' {
				start++
			}
			for start < len(data) && (data[start] == ' ' || data[start] == '\t') {
				start++
			}
		}
		value := r.Value
		switch {
		case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
			start++ // past the quote
		case n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0:
			return nil, fmt.Errorf("line %d: %q is a block scalar; write it on one line to have it rewritten", n.Line, n.Value)
		case n.Value == "":
			value = " " + value // an empty value sits right after its colon
		}
		end := start + len(n.Value)
		if end > len(data) || string(data[start:end]) != n.Value {
			return nil, fmt.Errorf("line %d: %q is not written as it reads (escapes or line folding); write it plainly on one line to have it rewritten", n.Line, n.Value)
		}
		spans = append(spans, span{start, end, value, n.Line})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var out bytes.Buffer
	last := 0
	for _, s := range spans {
		if s.start < last {
			return nil, fmt.Errorf("line %d: two replacements of one scalar", s.line)
		}
		out.Write(data[last:s.start])
		out.WriteString(s.value)
		last = s.end
	}
	out.Write(data[last:])
	// What cannot be written in place must not leave a broken file.
	if _, err := Documents(out.Bytes()); err != nil {
		return nil, fmt.Errorf("the rewritten file would not parse (%v); pin the references by hand", err)
	}
	return out.Bytes(), nil
}

// offset is the byte offset of a 1-based line and rune column.
func offset(data []byte, line, column int) (int, bool) {
	off := 0
	if line == 1 && bytes.HasPrefix(data, []byte("\uFEFF")) {
		off = 3 // yaml.v3 does not count a byte order mark
	}
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	for c := 1; c < column; c++ {
		if off >= len(data) || data[off] == '\n' {
			return 0, false
		}
		_, size := utf8.DecodeRune(data[off:])
		off += size
	}
	return off, true
}

// Walk calls visit for every node under n, parents first.
func Walk(n *yaml.Node, visit func(n *yaml.Node)) {
	visit(n)
	for _, c := range n.Content {
		Walk(c, visit)
	}
}

// Lookup is the value of key in a mapping node, nil when absent.
func Lookup(mapping *yaml.Node, key string) *yaml.Node {
	if mapping == nil || mapping.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		if mapping.Content[i].Value == key {
			return mapping.Content[i+1]
		}
	}
	return nil
}

// Pushed is where an image went: its repository (REGISTRY/REPO/IMAGE), the
// tag pushed and the index digest.
type Pushed struct {
	Name, Tag, Digest string
}

// Resolve pins the references in a YAML stream to the images pushed,
// keyed by their repository path (REPO/IMAGE, as kiln.yaml names them):
// every scalar that parses as a reference with that path, whatever its
// registry, tag or digest (image: antrea/antrea-agent:v2), becomes
// NAME@DIGEST; a mapping of Helm values with such a repository gets the
// pushed repository (its host in a registry key beside it, if any) and a
// digest, or tag@digest, beside it, or NAME@DIGEST as its repository when
// it has neither. It returns the stream and how many references it pinned.
func Resolve(data []byte, images map[string]Pushed) ([]byte, int, error) {
	docs, err := Documents(data)
	if err != nil {
		return nil, 0, err
	}
	var reps []Replacement
	pinned := 0
	done := map[*yaml.Node]bool{}
	replace := func(n *yaml.Node, value string) {
		if !done[n] {
			done[n] = true
			reps = append(reps, Replacement{n, value})
		}
	}
	pushedFor := func(n *yaml.Node) (Pushed, bool) {
		if n == nil || n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return Pushed{}, false
		}
		named, err := reference.ParseNormalizedNamed(n.Value)
		if err != nil {
			return Pushed{}, false
		}
		p, ok := images[reference.Path(named)]
		return p, ok
	}
	for _, doc := range docs {
		Walk(doc, func(n *yaml.Node) {
			if done[n] {
				return
			}
			if n.Kind == yaml.MappingNode {
				repo := Lookup(n, "repository")
				p, ok := pushedFor(repo)
				if !ok {
					return
				}
				// Helm values: image: {[registry: H,] repository: R, tag: T[, digest: D]}.
				pinned++
				name := p.Name
				if registry := Lookup(n, "registry"); registry != nil && registry.Kind == yaml.ScalarNode {
					host, path, _ := strings.Cut(p.Name, "/")
					replace(registry, host)
					name = path
				}
				switch digest, tag := Lookup(n, "digest"), Lookup(n, "tag"); {
				case digest != nil && digest.Kind == yaml.ScalarNode:
					replace(repo, name)
					replace(digest, p.Digest)
				case tag != nil && tag.Kind == yaml.ScalarNode:
					replace(repo, name)
					replace(tag, p.Tag+"@"+p.Digest)
				default:
					replace(repo, name+"@"+p.Digest)
				}
				return
			}
			if p, ok := pushedFor(n); ok {
				pinned++
				replace(n, p.Name+"@"+p.Digest)
			}
		})
	}
	if len(reps) == 0 {
		return data, 0, nil
	}
	out, err := Apply(data, reps)
	return out, pinned, err
}
