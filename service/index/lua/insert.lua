-- Index some shards' share of a batch and report what it shares with other tenants.
-- Contract: service/index/base.py (memory.py is the same logic in Python). Every key this
-- script touches starts with one of KEYS, whose hash tags pin each shard to one cluster slot;
-- on a Redis Cluster the caller sends one shard per call, on a single Redis several.
-- Layout, entry encoding and the presence filter: service/index/keys.py; common.lua comes first.
--
-- KEYS     shard bases, e.g. bw:{<key id>:a7}:ix5, in the order of their records
-- ARGV[1]  current generation     ARGV[2] generations to read
-- ARGV[3]  when the current generation's keys expire (Unix seconds, EXPIREAT)
-- ARGV[4]  common: tenants with it in a prompt   ARGV[5] common: tenants with it at all
-- ARGV[6]  struct format of one record
-- ARGV[7]  records per shard: one u32 big-endian per key of KEYS
-- ARGV[8]  records, big-endian, grouped by shard, in batch order within each (redis_index.py):
--          batch pos u32, tenant u32, doc u32, kind u8, bucket (raw bytes), field (raw bytes),
--          offset u32, then the record's own entry, encoded as stored (below), after its length u8
-- ARGV[9]  each record's bit in its shard's presence filter, decimal, space-separated
--          (redis.call would otherwise turn Lua numbers into strings, which costs more than
--          all the rest)
-- ARGV[10] a filter's size in bytes, to create it at exactly that size
-- ARGV[11] a value common by holders takes a mark for a tenant served it only within this many bytes
-- A bucket's key is <shard base> .. ':' .. generation .. ':' .. bucket bytes; a generation's
-- presence filter is <shard base> .. ':f:' .. generation, a bitmap with one bit (of several per
-- bucket) per fingerprint, set when its field is written: a clear bit proves the field is not in
-- that generation, and the read is skipped. Filters and buckets expire at the same second.
-- Stored value per field: '*' once common by senders, HELD, its senders' entries and served
-- marks once common only by holders, else entries, as common.lua says. A HELD value keeps this
-- generation's senders (fewer than ARGV[4]: bounded) and marks within ARGV[11] bytes; '*' replaces it
-- once the senders, over all generations, reach ARGV[4].
-- An entry's doc is the tenant's first document with the fingerprint, the lowest ref, whatever
-- order they arrived in; a tenant that was served it before it sent it is no sender (common.lua's fold).
-- Returns flat groups of five integers: batch pos, other tenant, its doc, its kinds, count.

local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local deadline = ARGV[3]
local common_prompt = tonumber(ARGV[4])
local common_any = tonumber(ARGV[5])
local format = ARGV[6]
local records = ARGV[8]
local filter_bytes = tonumber(ARGV[10])
local bit_offsets = parse_bits(ARGV[9])
local held_bytes = tonumber(ARGV[11])
local first_gen = cur - gens + 1

local function varint(n)
  if n < 128 then return char(n) end
  if n < 16384 then return char(n % 128 + 128, floor(n / 128)) end
  local t = {}
  while n >= 128 do
    t[#t + 1] = n % 128 + 128
    n = floor(n / 128)
  end
  t[#t + 1] = n
  return char(unpack(t))
end

local function entry(t, d, o, k)
  return varint(t * 8 + k) .. spack('>I4', d) .. varint(o)
end

local function mark(t)
  return varint(t * 8 + MARK)
end

local function set_bits(key, offsets)
  for first = 1, #offsets, CHUNK do
    local args, n = {}, 0
    for i = first, math.min(#offsets, first + CHUNK - 1) do
      args[n + 1] = 'SET'; args[n + 2] = 'u1'; args[n + 3] = offsets[i]; args[n + 4] = '1'
      n = n + 4
    end
    redis.call('BITFIELD', key, unpack(args))
  end
end

-- `value` (its entries from byte `from` on) with this record's entry folded into its tenant's (a
-- marked tenant stays marked), or else `item` appended (nil: nothing; a mark only if the value then
-- holds at most `limit` bytes); nil when that changes nothing.
local function with_entry(value, from, tenant, doc, offset, kind, item, limit)
  local found, out = false, nil
  each(value, from, function(t, d, o, k, first, after)
    if t ~= tenant then return false end
    found = true
    if k ~= MARK then
      local e = {d, o, k}
      fold(e, doc, offset, kind)
      if e[1] ~= d or e[2] ~= o or e[3] ~= k then
        out = sub(value, 1, first - 1) .. entry(t, e[1], e[2], e[3]) .. sub(value, after)
      end
    end
    return true
  end)
  if found or not item or (byte(item) % 8 == MARK and #value + #item > limit) then return out end
  return value .. item
end

-- A value common by holders, for the current generation: HELD, then the senders' entries of
-- `value` (this generation's entries, or nil) and marks for the others, but for `keep`'s entry, which
-- the record being inserted folds into next (it may make its tenant a sender).
local function held_of(value, keep)
  if not value then return HELD end
  local parts = {HELD}
  each(value, 1, function(t, d, o, k, first, after)
    parts[#parts + 1] = (sends(k) or t == keep) and sub(value, first, after - 1) or mark(t)
  end)
  return table.concat(parts)
end

local hits, order = {}, {}
local NONE = {}
local at, r = 1, 0  -- byte position in records, index of the last record read

for s, base in ipairs(KEYS) do
  local count = sunpack('>I4', ARGV[7], 4 * s - 3)
  local lo, hi = r + 1, r + count
  local gen_base, present, reads = {}, {}, bit_reads(bit_offsets, lo, hi)
  for gen = first_gen, cur do
    gen_base[gen] = base .. ':' .. gen .. ':'
    present[gen] = read_bits(base .. ':f:' .. gen, reads)
  end
  local cur_filter = base .. ':f:' .. cur
  local present_cur = present[cur]
  local set_now, new_bits, touched = {}, {}, {}

  for i = 1, count do
    r = r + 1
    local pos, tenant, doc, kind, bucket, field, offset, mine_entry, next_at = sunpack(format, records, at)
    at = next_at
    local bit_arg = bit_offsets[r]
    -- common: by senders ('*'); held: by holders, with fewer senders (HELD, or counted here).
    local merged, tenants, marked, common, held, current = NONE, NONE, NONE, false, false, nil
    for gen = first_gen, cur do
      if present[gen][i] == 1 or (gen == cur and set_now[bit_arg]) then
        local value = redis.call('HGET', gen_base[gen] .. bucket, field)
        if value then
          if gen == cur then current = value end
          if value == COMMON then common = true break end
          if merged == NONE then merged, tenants, marked = {}, {}, {} end
          held = merge_stored(value, merged, tenants, marked) or held
        end
      end
    end
    local now = kind == PROMPT  -- its tenant a sender, with this doc
    if common then  -- nothing to count
    elseif merged ~= NONE then  -- someone had it: hits, and maybe it is common now
      local senders = 0  -- a tenant marked as served it in any generation is none
      for _, t in ipairs(tenants) do
        if sends(merged[t][3]) and not marked[t] then senders = senders + 1 end
      end
      local mine = merged[tenant]
      if not held and senders < common_prompt and #tenants < common_any then
        local self_prompt = mine and band(mine[3], PROMPT) == PROMPT
        for _, t in ipairs(tenants) do
          local e = merged[t]
          -- What may be a leak, either way (memory.py's _counts). A prompt may be the source of
          -- an answer only as its tenant's first document with the text: after a prompt, the
          -- answer was judged with that one; after an answer, it resends what it was told.
          local hit
          if kind == RESPONSE then hit = not self_prompt or doc < mine[1]  -- or its prompt came later
          else hit = not sends(e[3]) and (not mine or doc < mine[1]) end
          if t ~= tenant and hit then
            local hk = pos .. ':' .. t .. ':' .. e[1] .. ':' .. e[3]
            local h = hits[hk]
            if h then h[5] = h[5] + 1 else
              hits[hk] = {pos, t, e[1], e[3], 1}
              order[#order + 1] = hk
            end
          end
        end
      end
      -- Common with this doc? It may make its tenant a sender, or, an earlier answer, no longer one.
      local was = mine and sends(mine[3]) and not marked[tenant]
      if mine then
        local e = {mine[1], mine[2], mine[3]}
        fold(e, doc, offset, kind)
        now = sends(e[3])
      end
      if marked[tenant] then now = false end  -- served it while it was held
      if now and not was then senders = senders + 1 elseif was and not now then senders = senders - 1 end
      common = senders >= common_prompt
      held = held or #tenants + (mine and 0 or 1) >= common_any
    else
      common = kind == PROMPT and common_prompt <= 1
      held = common_any <= 1
    end
    -- Record this tenant in the current generation.
    local new_value = nil
    if common then
      if current ~= COMMON then new_value = COMMON end
    elseif held then
      -- A value still of entries becomes HELD once, so that it stays common after the generations
      -- that made it so expire, as '*' does.
      if not current or byte(current) ~= HELD_BYTE then
        current = held_of(current, tenant)
        new_value = current
      end
      local item = nil  -- a sender's first prompt here, or a mark for a tenant served it
      if now and kind == PROMPT then item = mine_entry elseif not now and not marked[tenant] then item = mark(tenant) end
      new_value = with_entry(current, 2, tenant, doc, offset, kind, item, held_bytes) or new_value
    elseif not current then
      new_value = mine_entry
    else
      new_value = with_entry(current, 1, tenant, doc, offset, kind, mine_entry, 0)
    end
    if new_value then
      local key = gen_base[cur] .. bucket
      redis.call('HSET', key, field, new_value)
      touched[key] = true
      if present_cur[i] == 0 and not set_now[bit_arg] then
        set_now[bit_arg] = true
        new_bits[#new_bits + 1] = bit_arg
      end
    end
  end

  if #new_bits > 0 then
    if redis.call('EXISTS', cur_filter) == 0 then
      -- At its final size at once: growing bit by bit would leave it in a buffer twice as large.
      redis.call('SET', cur_filter, string.rep('\0', filter_bytes))
      redis.call('EXPIREAT', cur_filter, deadline)
    end
    set_bits(cur_filter, new_bits)
  end
  for key in pairs(touched) do redis.call('EXPIREAT', key, deadline) end
end

local out = {}
for _, hk in ipairs(order) do
  local h = hits[hk]
  for i = 1, 5 do out[#out + 1] = h[i] end
end
return out
