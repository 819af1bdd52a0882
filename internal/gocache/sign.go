package gocache

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/opencontainers/go-digest"

	"github.com/kiln-build/kiln/internal/buildkit"
)

// SignatureFile is the one file of a signature image.
const SignatureFile = "signature"

// SignatureTag is the tag that holds the signature of a snapshot tag.
func SignatureTag(tag string) string { return tag + ".sig" }

// signedMessage binds a signature to one snapshot layer: Fetch checks the
// layer against its digest, so the digest stands for every entry.
func signedMessage(layer digest.Digest) []byte {
	return []byte("kiln Go cache snapshot v1\n" + layer.String() + "\n")
}

// Sign returns the signature file of a snapshot layer.
func Sign(key ed25519.PrivateKey, layer digest.Digest) []byte {
	return []byte(base64.StdEncoding.EncodeToString(ed25519.Sign(key, signedMessage(layer))) + "\n")
}

// verifySignature fetches the signature image of ref and checks it against
// the layer with the pinned key.
func verifySignature(ctx context.Context, resolver remotes.Resolver, ref string, layer digest.Digest, key ed25519.PublicKey) error {
	sigRef := ref + ".sig"
	name, desc, err := resolver.Resolve(ctx, sigRef)
	if err != nil {
		return fmt.Errorf("unsigned: no signature at %s (%v); it must be signed with the key cache.gocacheKey pins", sigRef, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return err
	}
	sigLayer, err := snapshotLayer(ctx, fetcher, desc)
	if err != nil {
		return fmt.Errorf("%s: %w", sigRef, err)
	}
	blob, err := buildkit.ReadBlob(ctx, fetcher, sigLayer, 1<<20)
	if err != nil {
		return fmt.Errorf("%s: %w", sigRef, err)
	}
	sig, err := signatureFromLayer(blob, sigLayer.MediaType)
	if err != nil {
		return fmt.Errorf("%s: %w", sigRef, err)
	}
	if !ed25519.Verify(key, signedMessage(layer), sig) {
		return fmt.Errorf("%s: the signature does not verify with the key cache.gocacheKey pins", sigRef)
	}
	return nil
}

func signatureFromLayer(blob []byte, mediaType string) ([]byte, error) {
	var r io.Reader = bytes.NewReader(blob)
	if strings.HasSuffix(mediaType, "gzip") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("no %s file in the signature image", SignatureFile)
		} else if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(h.Name, "/") != SignatureFile {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(tr, 4096))
		if err != nil {
			return nil, err
		}
		return base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
	}
}

// LayerDigest resolves a pushed snapshot reference to its layer's digest,
// the value a signature covers.
func LayerDigest(ctx context.Context, ref string, opts FetchOptions) (digest.Digest, error) {
	resolver := newResolver(opts)
	name, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return "", err
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return "", err
	}
	layer, err := snapshotLayer(ctx, fetcher, desc)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ref, err)
	}
	return layer.Digest, nil
}
