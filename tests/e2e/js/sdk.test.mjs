// The unmodified npm `e2b` SDK against a live aenv node.
//
// E2B_API_URL, E2B_SANDBOX_URL (both the node's origin, plain http://127.0.0.1:<port>) and
// E2B_API_KEY come from the environment; tests/e2e/test_js_sdk.py sets them and runs
// `node --test` here. Only the SDK's public API is used.
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { test } from 'node:test'

import { CommandExitError, Sandbox } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  assert.ok(process.env[name], `${name} must point at the node`)
}

test('create, run a command, write/read a file, kill', async () => {
  const suite = randomUUID()
  const sbx = await Sandbox.create('base', {
    timeoutMs: 120_000,
    metadata: { suite },
    envs: { FOO: 'bar' },
  })
  try {
    assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
    assert.equal(await sbx.isRunning(), true)

    const r = await sbx.commands.run('echo hi; echo $FOO')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hi\nbar\n')
    await assert.rejects(sbx.commands.run('echo err >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stderr, 'err\n')
      return true
    })

    const text = `hello from node ${suite}\n`
    await sbx.files.write('/tmp/js-sdk.txt', text)
    assert.equal(await sbx.files.read('/tmp/js-sdk.txt'), text)
    assert.equal((await sbx.commands.run('cat /tmp/js-sdk.txt')).stdout, text)

    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i)
    await sbx.files.write('/tmp/js-sdk.bin', bytes)
    const back = await sbx.files.read('/tmp/js-sdk.bin', { format: 'bytes' })
    assert.deepEqual(Buffer.from(back), Buffer.from(bytes))

    const listed = await Sandbox.list({ query: { metadata: { suite } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])

    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.metadata.suite, suite)
  } finally {
    await sbx.kill()
  }
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})
