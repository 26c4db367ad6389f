// Drives `encore serve` with the official openai npm client: completions,
// chat, streaming, n = 3, logprobs, seeds and a field error. Prints one line
// per check; exits 1 on the first failure. Usage: node openai_client.mjs BASE_URL
import OpenAI from 'openai';

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const pure = { temperature: 1, top_p: 1 };

function check(ok, what) {
  if (!ok) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const c = await client.completions.create({
  model: 'encore', prompt: 'Once upon a time', max_tokens: 16, seed: 42, logprobs: 2, ...pure,
});
check(c.choices[0].text.length > 0, 'completion text');
check(c.seed === 42 && c.system_fingerprint.startsWith('fp_'), 'seed and system_fingerprint');
check(c.choices[0].logprobs.tokens.length === c.usage.completion_tokens, 'completion logprobs');
const again = await client.completions.create({
  model: 'encore', prompt: 'Once upon a time', max_tokens: 16, seed: 42, logprobs: 2, ...pure,
});
check(again.choices[0].text === c.choices[0].text, 'same seed, same text');
const other = await client.completions.create({
  model: 'encore', prompt: 'Once upon a time', max_tokens: 16, seed: 43, ...pure,
});
check(other.choices[0].text !== c.choices[0].text, 'another seed, another text');

const drawn = await client.completions.create({ model: 'encore', prompt: 'Tom', max_tokens: 12, ...pure });
const redo = await client.completions.create({
  model: 'encore', prompt: 'Tom', max_tokens: 12, seed: drawn.seed, ...pure,
});
check(Number.isSafeInteger(drawn.seed) && redo.choices[0].text === drawn.choices[0].text,
      'a drawn seed, sent back, reproduces the text');

const three = await client.completions.create({
  model: 'encore', prompt: 'Tom', max_tokens: 12, seed: 5, n: 3, ...pure,
});
check(three.choices.length === 3 && new Set(three.choices.map((x) => x.text)).size > 1, 'n = 3');

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about the dog' }];
const chat = await client.chat.completions.create({
  model: 'encore', messages, max_tokens: 20, seed: 7, logprobs: true, top_logprobs: 2, ...pure,
});
check(chat.choices[0].message.role === 'assistant', 'chat answer');
check(chat.choices[0].logprobs.content.length === chat.usage.completion_tokens &&
      chat.choices[0].logprobs.content[0].top_logprobs.length === 2, 'chat logprobs');

const stream = await client.chat.completions.create({
  model: 'encore', messages, max_tokens: 20, seed: 7, stream: true,
  stream_options: { include_usage: true }, ...pure,
});
let streamed = '';
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) streamed += ch.delta?.content ?? '';
}
check(streamed === chat.choices[0].message.content, 'streamed chat equals the whole answer');
check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'usage chunk');

try {
  await client.completions.create({ model: 'encore', prompt: 'x', temperature: 'hot' });
  check(false, 'a bad temperature was accepted');
} catch (e) {
  check(e.status === 400 && e.param === 'temperature', 'field error (400, param temperature)');
}
const models = await client.models.list();
check(models.data.length === 1, 'models list');
