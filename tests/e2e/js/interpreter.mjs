// The unmodified npm `@e2b/code-interpreter`, as a JS trainer calls it. With TEMPLATE set
// (tests/e2e/test_interpreter.py): a sandbox of it made through the node the E2B_* env vars
// name. Without: aenv's server on the host at URL (tests/integration/interpreter/
// test_server.py), reached in the SDK's debug mode as it would reach port 49999. JS=1: the
// javascript kernel too.
import { Sandbox } from '@e2b/code-interpreter'

const sbx = process.env.TEMPLATE
  ? await Sandbox.create(process.env.TEMPLATE, { timeoutMs: 300_000 })
  : await Sandbox.connect('debug', { debug: true, sandboxUrl: process.env.URL })
try {
  const sum = await sbx.runCode('1+1')
  const stdout = []
  const printed = await sbx.runCode("print('from js')", { onStdout: (m) => stdout.push(m.line) })
  const failed = await sbx.runCode('undefined_name')
  const js = process.env.JS
    ? (await sbx.runCode('[1, 2].map((x) => x * 21)[1]', { language: 'js' })).text : null
  console.log(JSON.stringify({
    text: sum.text, count: printed.executionCount - sum.executionCount, stdout,
    error: failed.error?.name, js,
  }))
} finally {
  if (process.env.TEMPLATE) await sbx.kill()
}
