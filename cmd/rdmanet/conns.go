package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

// maxConnsBody bounds what `rdmanet conns` reads from a handler: a
// program's list, not whatever a wrong URL answers.
const maxConnsBody = 64 << 20

func runConns(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	var conns []rdmanet.ConnInfo
	return runList(ctx, g, fs, args, "conns", "", "connections", &conns, func() { rdmanet.WriteConnTable(g.stdout, conns) })
}

// runGroups is `rdmanet groups`: the link groups, from the same handler.
func runGroups(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	var groups []rdmanet.GroupInfo
	return runList(ctx, g, fs, args, "groups", "groups", "link groups", &groups, func() { rdmanet.WriteGroupTable(g.stdout, groups) })
}

// runList fetches a list from a program's rdmanet.ConnsHandler (its view,
// if not ""), decodes it into list, and prints it with table or as JSON.
func runList(ctx context.Context, g *globals, fs *flag.FlagSet, args []string, name, view, what string, list any, table func()) int {
	timeout := fs.Duration("timeout", 10*time.Second, "give up after `duration`")
	pos, code, ok := parse(g, fs, args, 1)
	if !ok {
		return code
	}
	u, err := connsURL(pos[0], view)
	if err != nil {
		return usageError(g, fs, "%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	body, err := fetchConns(ctx, u)
	if err != nil {
		fmt.Fprintf(g.stderr, "rdmanet %s: %v\n", name, err)
		return exitFailure
	}
	if err := json.Unmarshal(body, list); err != nil {
		fmt.Fprintf(g.stderr, "rdmanet %s: %s did not answer a list of %s: %v\n", name, u, what, err)
		return exitFailure
	}
	if g.json {
		g.stdout.Write(body)
		return exitOK
	}
	table()
	return exitOK
}

// connsURL makes the URL to ask: an http(s) URL as given, or host:port
// with rdmanet.ConnsPath.
func connsURL(arg, view string) (string, error) {
	if !strings.Contains(arg, "://") {
		arg = "http://" + arg
	}
	u, err := url.Parse(arg)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("%q: want http://HOST:PORT/PATH or HOST:PORT", arg)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = rdmanet.ConnsPath
	}
	q := u.Query()
	q.Set("format", "json")
	if view != "" {
		q.Set("view", view)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// fetchConns gets the handler's JSON.
func fetchConns(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxConnsBody+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", u, resp.Status)
	}
	if len(body) > maxConnsBody {
		return nil, fmt.Errorf("%s: answer larger than %d bytes", u, maxConnsBody)
	}
	return body, nil
}
